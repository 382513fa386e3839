//! coord's TensorFlow schemas held up against TensorFlow 2.21's own: every message, enum and
//! service of a `tensorflow` package that coord compiles (`coord_proto::FILE_DESCRIPTOR_SET`) is
//! compared, field by field (number, type, label, type name, presence), with the descriptors the
//! `tensorflow-cpu` 2.21 wheel carries (`tests/tf/tf_schema.py check`). The venv is made by the
//! tests; the test skips, saying why, where it cannot be had.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Where coord's coordination schema knowingly differs from TF 2.21's: it keeps the seed's
/// device fields and messages (older clients send them) and spells `google.protobuf.Any` as a
/// message of its own (same wire shape).
const KNOWN: [&str; 7] = [
    "message .tensorflow.AnyMessage: not in TensorFlow's schema",
    "message .tensorflow.CoordinationServiceDeviceInfo: not in TensorFlow's schema",
    ".tensorflow.DeviceInfo.device: type_name '.tensorflow.AnyMessage', TensorFlow's '.google.protobuf.Any'",
    "message .tensorflow.TfDeviceList: not in TensorFlow's schema",
    ".tensorflow.WaitForAllTasksRequest.local_device_info: no such field in TensorFlow's schema",
    ".tensorflow.WaitForAllTasksResponse.cluster_device_info: no such field in TensorFlow's schema",
    "message .tensorflow.XlaDeviceList: not in TensorFlow's schema",
];

#[test]
fn tensorflows_schemas_are_tensorflow_2_21s() {
    let python = match coord_tests::tfdata::tf_python() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIP tensorflows_schemas_are_tensorflow_2_21s: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let fds = dir.path().join("coord.fds");
    std::fs::write(&fds, coord_proto::FILE_DESCRIPTOR_SET).expect("write the descriptor set");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tf")
        .join("tf_schema.py");
    let out = Command::new(python)
        .arg(script)
        .arg("check")
        .arg(&fds)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .expect("run tf_schema.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tf_schema.py check failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let checked = report["checked"].as_u64().expect("a count");
    let mismatches: Vec<&str> = report["mismatches"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let unexpected: Vec<&&str> = mismatches.iter().filter(|m| !KNOWN.contains(m)).collect();
    assert!(
        unexpected.is_empty(),
        "coord's schema differs from TensorFlow 2.21's: {unexpected:#?}"
    );
    // The tf.data service alone has some 300 fields; all of TF's schemas here, more.
    assert!(
        checked > 500,
        "only {checked} fields, values and methods were compared"
    );
}
