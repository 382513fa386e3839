//! The flags: parsing, defaults and the checks of their combinations.

use super::*;
use coord_proto::shape::parse_job;

/// Every flag has its `COORD_*` environment variable, named after it (as etcd has `ETCD_*`).
#[test]
fn every_flag_has_its_environment_variable() {
    use clap::CommandFactory;
    let command = Args::command();
    let mut flags = 0;
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let expected = format!("COORD_{}", long.to_uppercase().replace('-', "_"));
        let env = arg.get_env().map(|e| e.to_string_lossy().to_string());
        assert_eq!(env.as_deref(), Some(expected.as_str()), "--{long}");
        flags += 1;
    }
    assert!(flags >= 40, "{flags} flags");
}

/// A flag given in the environment takes effect; the command line wins over it; list flags
/// take comma-separated values there.
#[test]
fn flags_are_read_from_the_environment() {
    // The variables are read through clap's `env` lookup: set them for this process only
    // (no other test of this binary reads COORD_* variables).
    std::env::set_var("COORD_QUOTA_BYTES", "12345");
    std::env::set_var("COORD_JOB", "worker=4,ps=2");
    std::env::set_var("COORD_NO_PRE_APPEND", "true");
    std::env::set_var("COORD_HEARTBEAT_MS", "70");
    std::env::set_var("COORD_RAFT_LOG", "sled");
    let base = [
        "coordinator",
        "--id",
        "1",
        "--listen",
        "127.0.0.1:1",
        "--http-listen",
        "127.0.0.1:2",
        "--initial-cluster",
        "1=127.0.0.1:1",
        "--data-dir",
        "/tmp/x",
        "--heartbeat-ms",
        "60",
    ];
    let parsed = Args::try_parse_from(base);
    for var in [
        "COORD_QUOTA_BYTES",
        "COORD_JOB",
        "COORD_NO_PRE_APPEND",
        "COORD_HEARTBEAT_MS",
        "COORD_RAFT_LOG",
    ] {
        std::env::remove_var(var);
    }
    let args = parsed.expect("parse");
    assert_eq!(args.quota_bytes, 12345);
    assert_eq!(
        args.jobs,
        vec![("worker".to_string(), 4), ("ps".to_string(), 2)]
    );
    assert!(args.no_pre_append);
    assert_eq!(args.raft_log, RaftLogArg::Sled);
    assert_eq!(args.heartbeat_ms, 60, "the command line wins");
}

#[test]
fn parses_initial_cluster() {
    let c = parse_initial_cluster("1=127.0.0.1:7101, 2=127.0.0.1:7102,3=h:1").expect("parse");
    assert_eq!(c.0.len(), 3);
    assert_eq!(c.0[&3], "h:1");
    assert_eq!(c.to_string(), "1=127.0.0.1:7101,2=127.0.0.1:7102,3=h:1");
}

#[test]
fn rejects_bad_initial_cluster() {
    for bad in [
        "",
        "1",
        "x=h:1",
        "1=h",
        "1=h:notaport",
        "1=h:1,1=h:2",
        "1=:5",
    ] {
        assert!(parse_initial_cluster(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn parses_jobs() {
    assert_eq!(parse_job("worker=4"), Ok(("worker".to_string(), 4)));
    for bad in ["worker", "=3", "w=0", "w=x", "w=-1"] {
        assert!(parse_job(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn cluster_id_depends_on_token_and_members() {
    let a = parse_initial_cluster("1=h:1,2=h:2").expect("parse");
    let b = parse_initial_cluster("1=h:1,2=h:3").expect("parse");
    assert_eq!(a.cluster_id("t"), a.cluster_id("t"));
    assert_ne!(a.cluster_id("t"), a.cluster_id("u"));
    assert_ne!(a.cluster_id("t"), b.cluster_id("t"));
}
