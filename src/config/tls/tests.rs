//! Loading `tls` tables from files made here (rcgen): what loads, and that
//! every refusal names the key and the file but nothing of a key's content.

use std::os::unix::fs::PermissionsExt;

use super::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber, date_time_ymd,
};
use rustls_pki_types::pem::PemObject;

struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(name: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("isoswitch-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Files { dir }
    }

    /// Writes `name`; a `.key` is the owner's alone, as the switch wants.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        if name.ends_with(".key") {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        p
    }

    /// A CA and a leaf it signed for `names`: (ca.pem, leaf.pem, leaf.key).
    fn chain(&self, prefix: &str, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
        self.chain_with(prefix, names, |_| {}).0
    }

    /// [`Files::chain`] with the leaf's parameters changed by `edit`, and
    /// the CA to sign CRLs with.
    fn chain_with(
        &self,
        prefix: &str,
        names: &[&str],
        edit: impl FnOnce(&mut CertificateParams),
    ) -> (
        (PathBuf, PathBuf, PathBuf),
        CertifiedIssuer<'static, KeyPair>,
    ) {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{prefix} unit CA"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut leaf =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        leaf.distinguished_name.push(DnType::CommonName, names[0]);
        edit(&mut leaf);
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let files = (
            self.write(&format!("{prefix}-ca.pem"), &issuer.pem()),
            self.write(&format!("{prefix}.pem"), &cert.pem()),
            self.write(&format!("{prefix}.key"), &key.serialize_pem()),
        );
        (files, issuer)
    }

    /// A CRL `issuer` signed revoking `serials`.
    fn crl(
        &self,
        name: &str,
        issuer: &CertifiedIssuer<'static, KeyPair>,
        serials: &[u64],
    ) -> PathBuf {
        let crl = CertificateRevocationListParams {
            this_update: date_time_ymd(2020, 1, 1),
            next_update: date_time_ymd(2021, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&s| RevokedCertParams {
                    serial_number: SerialNumber::from(s),
                    revocation_time: date_time_ymd(2020, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(issuer)
        .unwrap();
        self.write(name, &crl.pem().unwrap())
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server(cert: &Path, key: &Path) -> TlsServer {
    toml::from_str(&format!("cert = {:?}\nkey = {:?}", cert, key)).unwrap()
}

#[test]
fn a_server_table_loads_and_reports_its_certificate() {
    let f = Files::new("server");
    let (ca, cert, key) = f.chain("switch", &["switch.example", "127.0.0.1"]);
    let mut t = server(&cert, &key);
    let loaded = t.load("service[0].front.tls").unwrap();
    assert_eq!(loaded.cert.key, "service[0].front.tls.cert");
    assert!(loaded.cert.subject.contains("switch.example"));
    assert!(loaded.cert.not_after > 2_000_000_000);
    t.client_ca = Some(ca);
    t.client_names = vec!["nac-01".into()];
    t.min_version = TlsVersion::V1_3;
    t.load("service[0].front.tls").unwrap();
}

#[test]
fn defaults_are_tls_1_2_and_up_and_a_ten_second_handshake() {
    let t: TlsServer = toml::from_str("cert = \"a\"\nkey = \"b\"").unwrap();
    assert_eq!(t.min_version, TlsVersion::V1_2);
    assert_eq!(t.handshake_timeout, Duration::from_secs(10));
    let v: TlsServer = toml::from_str("cert = \"a\"\nkey = \"b\"\nmin_version = \"1.3\"").unwrap();
    assert_eq!(v.min_version, TlsVersion::V1_3);
    assert!(
        toml::from_str::<TlsServer>("cert = \"a\"\nkey = \"b\"\nmin_version = \"1.1\"").is_err()
    );
    assert!(toml::from_str::<TlsServer>("cert = \"a\"\nkey = \"b\"\nkeyfile = \"c\"").is_err());
}

#[test]
fn a_missing_file_names_the_key_and_the_file() {
    let f = Files::new("missing");
    let (_, cert, _) = f.chain("switch", &["switch.example"]);
    let e = server(&cert, &f.dir.join("nope.key"))
        .load("admin.tls")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("admin.tls.key: "), "{e}");
    assert!(e.contains("nope.key"), "{e}");
}

#[test]
fn a_broken_key_is_refused_without_showing_its_content() {
    let f = Files::new("broken");
    let (_, cert, key) = f.chain("switch", &["switch.example"]);
    let text = std::fs::read_to_string(&key).unwrap();
    let body: String = text.lines().nth(1).unwrap().to_string();
    // A key with a line of it damaged.
    let damaged = text.replacen(&body, &format!("{body}!!"), 1);
    let bad = f.write("bad.key", &damaged);
    let e = server(&cert, &bad)
        .load("service[1].front.tls")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("service[1].front.tls.key: "), "{e}");
    assert!(
        !e.contains(&body[..20]),
        "the error shows key material: {e}"
    );
    // A key that is not this certificate's.
    let (_, _, other) = f.chain("other", &["other.example"]);
    let e = server(&cert, &other).load("t").unwrap_err().to_string();
    assert!(e.contains("does not match"), "{e}");
    // A certificate file that holds no certificate.
    let e = server(&key, &key).load("t").unwrap_err().to_string();
    assert!(e.starts_with("t.cert: "), "{e}");
}

#[test]
fn client_names_need_a_client_ca() {
    let t: TlsServer = toml::from_str("cert = \"a\"\nkey = \"b\"\nclient_names = [\"x\"]").unwrap();
    let e = t.validate("service[0].front.tls").unwrap_err();
    assert!(
        matches!(
            e,
            TlsError::Invalid {
                reason: TlsReason::Rule(_),
                ..
            }
        ),
        "{e}"
    );
    let e = e.to_string();
    assert!(e.starts_with("service[0].front.tls.client_names: "), "{e}");
}

#[test]
fn a_client_table_loads_with_and_without_its_own_certificate() {
    let f = Files::new("client");
    let (ca, cert, key) = f.chain("node", &["node.example"]);
    let c: TlsClient = toml::from_str(&format!("ca = {ca:?}")).unwrap();
    let loaded = c.load("service[0].back.tls").unwrap();
    assert!(loaded.cert.is_none() && loaded.server_name.is_none());
    let c: TlsClient = toml::from_str(&format!(
        "ca = {ca:?}\ncert = {cert:?}\nkey = {key:?}\nserver_name = \"node.example\""
    ))
    .unwrap();
    let loaded = c.load("service[0].back.tls").unwrap();
    assert_eq!(loaded.cert.unwrap().key, "service[0].back.tls.cert");
    let half: TlsClient = toml::from_str(&format!("ca = {ca:?}\ncert = {cert:?}")).unwrap();
    let e = half.load("service[0].back.tls").unwrap_err().to_string();
    assert!(e.starts_with("service[0].back.tls.key: "), "{e}");
    let bad: TlsClient =
        toml::from_str(&format!("ca = {ca:?}\nserver_name = \"no spaces\"")).unwrap();
    assert!(
        bad.load("k")
            .unwrap_err()
            .to_string()
            .starts_with("k.server_name")
    );
}

#[test]
fn names_of_reads_the_cn_and_every_alternative_name() {
    let f = Files::new("names");
    let (_, cert, _) = f.chain("leaf", &["nac-01.bank", "10.1.2.3"]);
    let der = CertificateDer::from_pem_file(&cert).unwrap();
    let names = names_of(der.as_ref());
    assert!(names.contains(&"nac-01.bank".to_string()), "{names:?}");
    assert!(names.contains(&"10.1.2.3".to_string()), "{names:?}");
    assert!(subject_of(der.as_ref()).unwrap().contains("CN=nac-01.bank"));
}

#[test]
fn a_key_file_group_or_others_may_read_is_refused_naming_the_key() {
    let f = Files::new("modes");
    let (_, cert, key) = f.chain("switch", &["switch.example"]);
    for mode in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = server(&cert, &key)
            .load("admin.tls")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("admin.tls.key: "), "{e}");
        assert!(
            e.contains(&format!("mode {mode:04o}")) && e.contains("chmod 600"),
            "{e}"
        );
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    server(&cert, &key).load("admin.tls").unwrap();
}

#[test]
fn an_expired_or_not_yet_valid_certificate_is_refused_naming_the_key() {
    let f = Files::new("validity");
    let ((ca, old, old_key), _) = f.chain_with("old", &["old.example"], |p| {
        p.not_before = date_time_ymd(2000, 1, 1);
        p.not_after = date_time_ymd(2001, 1, 1);
    });
    let e = server(&old, &old_key)
        .load("service[0].front.tls")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("service[0].front.tls.cert: "), "{e}");
    assert!(e.contains("expired on 2001-01-01T00:00:00Z"), "{e}");
    let client: TlsClient = toml::from_str(&format!(
        "ca = {ca:?}
cert = {old:?}
key = {old_key:?}"
    ))
    .unwrap();
    let e = client.load("service[0].back.tls").unwrap_err().to_string();
    assert!(e.starts_with("service[0].back.tls.cert: "), "{e}");
    let ((_, early, early_key), _) = f.chain_with("early", &["early.example"], |p| {
        p.not_before = date_time_ymd(2090, 1, 1);
        p.not_after = date_time_ymd(2091, 1, 1);
    });
    let e = server(&early, &early_key)
        .load("admin.tls")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("admin.tls.cert: "), "{e}");
    assert!(e.contains("not valid before 2090-01-01T00:00:00Z"), "{e}");
}

#[test]
fn the_cas_are_reported_for_their_expiry() {
    let f = Files::new("cas");
    let (ca, cert, key) = f.chain("switch", &["switch.example"]);
    let mut t = server(&cert, &key);
    t.client_ca = Some(ca.clone());
    let loaded = t.load("admin.tls").unwrap();
    assert_eq!(loaded.cas.len(), 1);
    assert_eq!(loaded.cas[0].key, "admin.tls.client_ca");
    assert!(loaded.cas[0].subject.contains("switch unit CA"));
    let c: TlsClient = toml::from_str(&format!("ca = {ca:?}")).unwrap();
    let loaded = c.load("service[0].back.tls").unwrap();
    assert_eq!(loaded.cas[0].key, "service[0].back.tls.ca");
}

#[test]
fn a_crl_loads_from_its_ca_and_is_refused_from_another_or_without_a_ca() {
    let f = Files::new("crl");
    let ((ca, cert, key), issuer) = f.chain_with("switch", &["switch.example"], |_| {});
    let ((_, _, _), stranger) = f.chain_with("stranger", &["x.example"], |_| {});
    let good = f.crl("good.crl", &issuer, &[7, 9]);
    let alien = f.crl("alien.crl", &stranger, &[7]);
    let mut t = server(&cert, &key);
    t.client_ca = Some(ca);
    t.client_crl = vec![good.clone()];
    let loaded = t.load("service[0].front.tls").unwrap();
    assert_eq!(loaded.crls.len(), 1);
    assert_eq!(loaded.crls[0].key, "service[0].front.tls.client_crl[0]");
    assert_eq!(loaded.crls[0].next_update, Some(1_609_459_200));
    t.client_crl = vec![good, alien];
    let e = t.load("service[0].front.tls").unwrap_err().to_string();
    assert!(e.starts_with("service[0].front.tls.client_crl[1]: "), "{e}");
    assert!(e.contains("not by a certificate of"), "{e}");
    t.client_crl = vec![cert.clone()];
    let e = t.load("service[0].front.tls").unwrap_err().to_string();
    assert!(e.starts_with("service[0].front.tls.client_crl[0]: "), "{e}");
    let no_ca: TlsServer = toml::from_str(&format!(
        "cert = {cert:?}
key = {key:?}
client_crl = [{cert:?}]"
    ))
    .unwrap();
    let e = no_ca.validate("admin.tls").unwrap_err().to_string();
    assert!(e.starts_with("admin.tls.client_crl: "), "{e}");
}
