//! Every request message of every service decoded from hostile bytes: random buffers and
//! mutations of a valid encoding. prost must return a value or an error, never panic, and a
//! value that decodes must encode again.

use coord_proto::fuzz::xorshift;
use prost::Message;

fn fuzz<M: Message + Default>(next: &mut impl FnMut() -> u64, decoded: &mut usize) {
    for round in 0..400u32 {
        let bytes: Vec<u8> = if round.is_multiple_of(2) {
            (0..next() % 200).map(|_| next() as u8).collect()
        } else {
            // A plausible prefix: field 1 or 2, then noise.
            let mut b = vec![(((1 + next() % 2) << 3) | (next() % 3)) as u8];
            b.extend((0..next() % 60).map(|_| next() as u8));
            b
        };
        if let Ok(m) = M::decode(bytes.as_slice()) {
            *decoded += 1;
            let again = m.encode_to_vec();
            assert!(M::decode(again.as_slice()).is_ok());
        }
    }
}

#[test]
fn every_request_decoder_survives_hostile_bytes() {
    let mut next = xorshift(0x0DEC_0DE5);
    let mut decoded = 0;
    fuzz::<coord_proto::tensorflow::RegisterTaskRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::HeartbeatRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::WaitForAllTasksRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::ShutdownTaskRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::ResetTaskRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::ReportErrorToTaskRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::ReportErrorToServiceRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::InsertKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::GetKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::TryGetKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::GetKeyValueDirRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::DeleteKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::BarrierRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::tensorflow::CancelBarrierRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::RegisterTaskRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::HeartbeatRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::PollForErrorRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::ReportErrorToServiceRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::ShutdownTaskRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::WatchTasksRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::InsertKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::GetKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::TryGetKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::IncrementKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::GetKeyValueDirRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::DeleteKeyValueRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::BarrierRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::CancelBarrierRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::xla::coordination::GetAliveTasksRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::admin::StatusRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::admin::ShutdownServiceRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::admin::AddMemberRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::admin::RemoveMemberRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::admin::TasksRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::admin::BarriersRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::admin::SnapshotRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::coordination::PollForErrorRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::coordination::GetTaskStateRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::GetOrRegisterDatasetRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::GetDatasetDefRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::GetOrCreateJobRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::ReleaseJobClientRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::ClientHeartbeatRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::WorkerHeartbeatRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::WorkerUpdateRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::GetSplitRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::GetWorkersRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::ListJobsRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::JournalRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::dispatcher::GetElementRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::kv::IncrementRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::kv::WatchRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::link::RecvTensorRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::link::PeerHeartbeatRequest>(&mut next, &mut decoded);
    fuzz::<coord_proto::coord::raft::RaftRequest>(&mut next, &mut decoded);
    // Some inputs decode (empty and field-skipping ones at least): the loop really ran decoders.
    assert!(decoded > 100, "only {decoded} inputs decoded");
}
