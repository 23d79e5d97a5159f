//! Loading `tls` tables from files made here (rcgen): what loads, and that
//! every refusal names the key and the file but nothing of a key's content.

use super::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

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

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A CA and a leaf it signed for `names`: (ca.pem, leaf.pem, leaf.key).
    fn chain(&self, prefix: &str, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "unit CA");
        let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut leaf =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        leaf.distinguished_name.push(DnType::CommonName, names[0]);
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (
            self.write(&format!("{prefix}-ca.pem"), &issuer.pem()),
            self.write(&format!("{prefix}.pem"), &cert.pem()),
            self.write(&format!("{prefix}.key"), &key.serialize_pem()),
        )
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
    let e = t.validate("service[0].front.tls").unwrap_err().to_string();
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
