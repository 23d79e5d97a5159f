//! Test certificates, made by each test run (rcgen): a CA and the leaves it
//! signs, written as PEM files under the target's tmp dir. No private key is
//! ever committed.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber, date_time_ymd,
};

/// A CA of its own and the files of what it signed.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate's files.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("pki dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        // Signs certificates and revocation lists.
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, issuer.pem()).expect("write CA");
        Pki { dir, ca, issuer }
    }

    /// A leaf for `names` (DNS names or IP addresses; the first is also the
    /// CN), written as `FILE.pem` and `FILE.key`.
    pub fn issue(&self, file: &str, names: &[&str]) -> Leaf {
        self.issue_with(file, names, |_| {})
    }

    /// [`Pki::issue`] with the leaf's parameters changed by `edit` (its
    /// validity, its serial number).
    pub fn issue_with(
        &self,
        file: &str,
        names: &[&str],
        edit: impl FnOnce(&mut CertificateParams),
    ) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let sans: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        edit(&mut params);
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        let leaf = Leaf {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write cert");
        write_key(&leaf.key, &key.serialize_pem());
        leaf
    }

    /// A leaf with the serial number `serial` (for a CRL to name).
    pub fn issue_serial(&self, file: &str, names: &[&str], serial: u64) -> Leaf {
        self.issue_with(file, names, |p| {
            p.serial_number = Some(SerialNumber::from(serial));
        })
    }

    /// A CRL of this CA revoking `serials`, written as `FILE` (PEM), valid
    /// from 2020 to 2100.
    pub fn crl(&self, file: &str, serials: &[u64]) -> PathBuf {
        let crl = CertificateRevocationListParams {
            this_update: date_time_ymd(2020, 1, 1),
            next_update: date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(serials.len() as u64 + 1),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&s| RevokedCertParams {
                    serial_number: SerialNumber::from(s),
                    revocation_time: date_time_ymd(2020, 1, 2),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer)
        .expect("CRL");
        let path = self.dir.join(file);
        std::fs::write(&path, crl.pem().expect("CRL PEM")).expect("write CRL");
        path
    }
}

/// A private key file, its owner's alone (the switch refuses one others may
/// read).
pub fn write_key(path: &Path, pem: &str) {
    std::fs::write(path, pem).expect("write key");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
}

impl Leaf {
    /// `--tls-cert C --tls-key K` for a simulator.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }
}
