//! Schema migrations: `comb migrate` applies them once; a server refuses a database whose
//! schema is newer than it knows.

mod common;

use std::process::Command;

use comb_harness::Postgres;
use common::comb_bin;

fn comb(args: &[&str], database_url: &str) -> std::process::Output {
    Command::new(comb_bin())
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("COMB_LISTEN", "127.0.0.1:0")
        .output()
        .expect("comb runs")
}

#[test]
fn migrate_applies_every_version_once() {
    let pg = Postgres::shared();
    let url = pg.create_database("m").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    let out = comb(&["migrate"], &url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let versions = pg
        .psql(
            &db,
            "SELECT string_agg(version::text, ',' ORDER BY version) FROM comb.migrations",
        )
        .unwrap();
    assert_eq!(versions.trim(), "1,2");
    // Running it again changes nothing.
    let out = comb(&["migrate"], &url);
    assert!(out.status.success());
    assert_eq!(
        pg.psql(&db, "SELECT count(*) FROM comb.migrations")
            .unwrap()
            .trim(),
        "2"
    );
    assert_eq!(
        pg.psql(&db, "SELECT count(*) FROM comb.segments")
            .unwrap()
            .trim(),
        "1"
    );
}

#[test]
fn a_server_refuses_a_schema_newer_than_it_knows() {
    let pg = Postgres::shared();
    let url = pg.create_database("m").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    assert!(comb(&["migrate"], &url).status.success());
    pg.psql(
        &db,
        "INSERT INTO comb.migrations (version, name) VALUES (999, 'from the future')",
    )
    .unwrap();
    for args in [&["migrate"][..], &["serve"][..]] {
        let out = comb(args, &url);
        assert!(!out.status.success(), "{args:?} must refuse");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("newer than this server knows"),
            "{args:?}: {err}"
        );
    }
}
