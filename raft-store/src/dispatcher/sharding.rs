//! TensorFlow's `ProcessingModeDef.ShardingPolicy`, as its wire numbers. coord's
//! `ProcessingMode` (OFF, DYNAMIC, FILE, DATA) has the same numbers.

pub const OFF: i32 = 0;
pub const DYNAMIC: i32 = 1;
pub const FILE: i32 = 2;
pub const DATA: i32 = 3;
pub const FILE_OR_DATA: i32 = 4;
pub const HINT: i32 = 5;

/// Static sharding: worker i of n reads its share.
pub fn is_static(policy: i32) -> bool {
    matches!(policy, FILE | DATA | FILE_OR_DATA | HINT)
}

pub fn name(policy: i32) -> &'static str {
    match policy {
        OFF => "OFF",
        DYNAMIC => "DYNAMIC",
        FILE => "FILE",
        DATA => "DATA",
        FILE_OR_DATA => "FILE_OR_DATA",
        HINT => "HINT",
        _ => "unknown",
    }
}
