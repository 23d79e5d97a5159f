//! Test certificates, made by each test run (rcgen): a CA and the leaves it
//! signs, written as PEM files under the target's tmp dir. No private key is
//! ever committed.

#![allow(dead_code)]

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

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
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, issuer.pem()).expect("write CA");
        Pki { dir, ca, issuer }
    }

    /// A leaf for `names` (DNS names or IP addresses; the first is also the
    /// CN), written as `FILE.pem` and `FILE.key`.
    pub fn issue(&self, file: &str, names: &[&str]) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let sans: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        let leaf = Leaf {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write cert");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write key");
        leaf
    }
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
