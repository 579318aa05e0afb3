//! TLS: HTTPS on the listener with a certificate reloaded on SIGHUP, and connections to a
//! PostgreSQL that serves TLS, as `sslmode` and `COMB_DATABASE_CA_FILE` ask. Certificates
//! are made by the tests (rcgen).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use comb_harness::{Postgres, Server};

use crate::common;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use reqwest::StatusCode;
use serde_json::json;

/// A certificate authority and a certificate it signed for 127.0.0.1 and localhost.
struct Identity {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn identity() -> Identity {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    Identity {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A `comb serve` with HTTPS, killed when dropped.
struct HttpsServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HttpsServer {
    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
}

/// A client trusting only `ca_pem`, with no connection kept between requests.
fn client_trusting(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Polls `GET /health` with a client trusting `ca_pem` until it answers 200.
async fn until_healthy(server: &HttpsServer, ca_pem: &str) {
    let start = std::time::Instant::now();
    while start.elapsed() < common::PATIENCE {
        if let Ok(r) = client_trusting(ca_pem)
            .get(server.url("/health"))
            .send()
            .await
            && r.status() == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no HTTPS answer; log:\n{}", server.log());
}

#[tokio::test]
async fn https_serves_the_api_and_takes_a_new_certificate_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let first = identity();
    let cert = write(dir.path(), "cert.pem", &first.cert_pem);
    let key = write(dir.path(), "key.pem", &first.key_pem);
    let db = tokio::task::spawn_blocking(|| Postgres::shared().create_database("tls"))
        .await
        .unwrap()
        .unwrap();
    let port = comb_harness::free_port();
    let log = dir.path().join("comb.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(common::comb_bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .env("DATABASE_URL", &db)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let server = HttpsServer { child, port, log };
    until_healthy(&server, &first.ca_pem).await;

    // The API over HTTPS.
    let http = client_trusting(&first.ca_pem);
    let r = http
        .post(server.url("/api/v1/push"))
        .json(&json!({"items": [{"queue": "q", "payload": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // Plain HTTP on the same port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");

    // Renewal: new files, then SIGHUP.
    let second = identity();
    write(dir.path(), "cert.pem", &second.cert_pem);
    write(dir.path(), "key.pem", &second.key_pem);
    server.signal("HUP");
    until_healthy(&server, &second.ca_pem).await;
    assert!(
        client_trusting(&first.ca_pem)
            .get(server.url("/health"))
            .send()
            .await
            .is_err(),
        "the old certificate is still served"
    );

    // A broken renewal keeps the certificate in use.
    write(dir.path(), "cert.pem", "not a certificate");
    server.signal("HUP");
    common::until("the failed reload logged", || async {
        server.log().contains("TLS certificate not reloaded")
    })
    .await;
    let r = client_trusting(&second.ca_pem)
        .get(server.url("/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_key_that_does_not_match_stops_the_server_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (identity(), identity());
    let cert = write(dir.path(), "cert.pem", &a.cert_pem);
    let key = write(dir.path(), "key.pem", &b.key_pem);
    let db = tokio::task::spawn_blocking(|| Postgres::shared().create_database("tls"))
        .await
        .unwrap()
        .unwrap();
    let out = Command::new(common::comb_bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .env("DATABASE_URL", &db)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS identity"), "{err}");
}

/// Starts a server on `url` with `env`, in a blocking task.
async fn server_on(url: String, env: Vec<(&'static str, String)>) -> std::io::Result<Server> {
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Server::start_with_env(common::comb_bin(), &url, &[], &env)
    })
    .await
    .unwrap()
}

/// Pushes and pops one message through `server`.
async fn round_trip(server: &Server) {
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/api/v1/push", server.base_url()))
        .json(&json!({"items": [{"queue": "q", "payload": {"n": 1}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = http
        .get(format!(
            "{}/api/v1/pop/queue/q?autoAck=true",
            server.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn database_connections_follow_sslmode() {
    // A cluster serving TLS with a certificate of our own authority.
    let dir = tempfile::Builder::new()
        .prefix("combtls")
        .tempdir_in("/tmp")
        .unwrap();
    let id = identity();
    let cert = write(dir.path(), "server.crt", &id.cert_pem);
    let key = write(dir.path(), "server.key", &id.key_pem);
    let ca = write(dir.path(), "ca.pem", &id.ca_pem);
    let other_ca = write(dir.path(), "other-ca.pem", &identity().ca_pem);
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let pg = postgres_with_tls(dir.path(), &cert, &key).await;
    let db = pg.create_database("tls").unwrap();
    let name = db.rsplit('/').next().unwrap().to_string();
    let encrypted = |app: &str| encrypted(&pg, &name, app);

    for (mode, app, want) in [
        ("require", "comb_require", "t"),
        ("prefer", "comb_prefer", "t"),
        ("disable", "comb_disable", "f"),
    ] {
        let url = format!("{db}?sslmode={mode}&application_name={app}");
        let server = server_on(url, vec![]).await.expect(mode);
        round_trip(&server).await;
        assert_eq!(encrypted(app), want, "sslmode={mode}");
    }
    // No sslmode at all: prefer.
    let server = server_on(format!("{db}?application_name=comb_default"), vec![])
        .await
        .unwrap();
    round_trip(&server).await;
    assert_eq!(encrypted("comb_default"), "t");

    // With a certificate authority, the server's certificate is verified.
    let url = format!("{db}?sslmode=require&application_name=comb_verified");
    // verify-ca and verify-full with the authority named in the URL, as libpq reads it.
    for mode in ["verify-ca", "verify-full"] {
        let app = format!("comb_{}", mode.replace('-', "_"));
        let server = server_on(
            format!(
                "{db}?sslmode={mode}&sslrootcert={}&application_name={app}",
                ca.display()
            ),
            vec![],
        )
        .await
        .unwrap_or_else(|e| panic!("{mode}: {e}"));
        round_trip(&server).await;
        assert_eq!(encrypted(&app), "t", "sslmode={mode}");
    }
    let server = server_on(
        url.clone(),
        vec![("COMB_DATABASE_CA_FILE", ca.display().to_string())],
    )
    .await
    .unwrap();
    round_trip(&server).await;
    assert_eq!(encrypted("comb_verified"), "t");
    let refused = server_on(
        url,
        vec![("COMB_DATABASE_CA_FILE", other_ca.display().to_string())],
    )
    .await;
    assert!(
        refused.is_err(),
        "a certificate of another authority was accepted"
    );
}

#[tokio::test]
async fn sslmode_disable_and_require_against_a_cluster_without_tls() {
    let db = tokio::task::spawn_blocking(|| Postgres::shared().create_database("tls"))
        .await
        .unwrap()
        .unwrap();
    let server = server_on(format!("{db}?sslmode=disable"), vec![])
        .await
        .unwrap();
    round_trip(&server).await;
    let refused = server_on(format!("{db}?sslmode=require"), vec![]).await;
    let e = refused
        .err()
        .expect("require without TLS on the server")
        .to_string();
    assert!(e.contains("TLS"), "{e}");
}

/// A self-signed X.509 version 1 certificate for localhost and its key, made by `openssl
/// x509 -req` without extensions (what Citus and many hand-made setups serve), in `dir`.
fn version_1_certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key, csr) = (dir.join("v1.crt"), dir.join("v1.key"), dir.join("v1.csr"));
    let ok = Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr)
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl req");
    let ok = Command::new("openssl")
        .args(["x509", "-req", "-days", "2"])
        .arg("-in")
        .arg(&csr)
        .arg("-signkey")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl x509");
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&cert)
        .output()
        .unwrap()
        .stdout;
    assert!(
        String::from_utf8_lossy(&text).contains("Version: 1 (0x0)"),
        "openssl made no version 1 certificate"
    );
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    (cert, key)
}

#[tokio::test]
async fn sslmode_as_libpq_means_it_against_a_self_signed_version_1_certificate() {
    let dir = tempfile::Builder::new()
        .prefix("combtls1")
        .tempdir_in("/tmp")
        .unwrap();
    let (cert, key) = version_1_certificate(dir.path());
    let other_ca = write(dir.path(), "other-ca.pem", &identity().ca_pem);
    let pg = postgres_with_tls(dir.path(), &cert, &key).await;
    let db = pg.create_database("tls1").unwrap();
    let name = db.rsplit('/').next().unwrap().to_string();
    let encrypted = |app: &str| encrypted(&pg, &name, app);

    // prefer (also by default) and require encrypt without verifying.
    for (query, app) in [
        ("sslmode=prefer&", "comb_v1_prefer"),
        ("sslmode=require&", "comb_v1_require"),
        ("", "comb_v1_default"),
    ] {
        let url = format!("{db}?{query}application_name={app}");
        let server = server_on(url, vec![])
            .await
            .unwrap_or_else(|e| panic!("{app}: {e}"));
        round_trip(&server).await;
        assert_eq!(encrypted(app), "t", "{app}");
    }

    // verify-ca and verify-full verify: without an authority they cannot start ...
    for mode in ["verify-ca", "verify-full"] {
        let e = server_on(format!("{db}?sslmode={mode}"), vec![])
            .await
            .err()
            .unwrap_or_else(|| panic!("{mode} started without an authority"))
            .to_string();
        assert!(
            e.contains(&format!("sslmode={mode} needs a certificate authority")),
            "{e}"
        );
    }
    // ... an authority that did not sign the certificate refuses it ...
    for mode in ["verify-ca", "verify-full"] {
        let url = format!("{db}?sslmode={mode}&sslrootcert={}", other_ca.display());
        let e = server_on(url, vec![])
            .await
            .err()
            .unwrap_or_else(|| panic!("{mode} took an untrusted certificate"))
            .to_string();
        assert!(
            e.contains(&format!("TLS with the database failed (sslmode={mode})")),
            "{e}"
        );
    }
    // ... and trusting the version 1 certificate itself still cannot verify it, said so.
    let url = format!("{db}?sslmode=verify-full&sslrootcert={}", cert.display());
    let e = server_on(url, vec![])
        .await
        .err()
        .expect("verify-full took a version 1 certificate")
        .to_string();
    assert!(e.contains("version 1"), "{e}");
    // An authority given to require makes it verify, as libpq's does.
    let url = format!("{db}?sslmode=require&sslrootcert={}", other_ca.display());
    assert!(
        server_on(url, vec![]).await.is_err(),
        "require with an authority took an untrusted certificate"
    );
}

/// A PostgreSQL of its own serving TLS with this certificate and key (in `dir`). The cluster
/// runs as `postgres` when the tests run as root: its files must be its own.
async fn postgres_with_tls(
    dir: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Postgres {
    if Command::new("id")
        .arg("-u")
        .output()
        .unwrap()
        .stdout
        .trim_ascii()
        == b"0"
    {
        let ok = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());
    tokio::task::spawn_blocking(move || {
        Postgres::start_with(&[
            ("ssl", "on"),
            ("ssl_cert_file", &cert_s),
            ("ssl_key_file", &key_s),
        ])
        .unwrap()
    })
    .await
    .unwrap()
}

/// Whether every connection of `app` to database `name` is encrypted (and there is one).
fn encrypted(pg: &Postgres, name: &str, app: &str) -> String {
    pg.psql(
        name,
        &format!(
            "SELECT count(*) > 0 AND bool_and(s.ssl) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = '{app}'"
        ),
    )
    .unwrap()
}
