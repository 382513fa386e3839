//! What the router reads off a call before driving it: the caller's deadline, the namespace the
//! method acts in, whom it counts against, whether it may wait on the service for long, and
//! whether its clients take `UNAVAILABLE` as fatal.

use std::time::Duration;

use tonic::Request;

use crate::ops::limits::ClientKey;
use crate::serve::namespace::Ns;

/// The deadline the caller set (`grpc-timeout`: digits and a unit), from when it arrived.
pub(super) fn caller_deadline<T>(req: &Request<T>) -> Option<Duration> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The namespace `method` acts in when bound to `ns`: its own, but the calls that manage
/// namespaces name the one they act on, and run outside every namespace.
pub(super) fn served_in(method: &str, ns: Ns) -> Ns {
    if method.starts_with("namespaces/") {
        None
    } else {
        ns
    }
}

/// Who `req` counts against: its request-id client, else its connection.
pub(super) fn client_key<T>(req: &Request<T>) -> ClientKey {
    match coord_proto::metadata::WireRequestId::read(req.metadata()) {
        Ok(Some(id)) => ClientKey::Id(id.client),
        _ => req
            .remote_addr()
            .map_or(ClientKey::Unknown, ClientKey::Connection),
    }
}

/// Calls that may legitimately wait on the service for long: a follower forwarding them does not
/// time them out.
pub(super) fn waits_on_the_service(method: &str) -> bool {
    match method.strip_prefix("xla/") {
        // XLA's registration waits at the register barrier.
        Some(m) => matches!(
            m,
            "RegisterTask"
                | "GetKeyValue"
                | "Barrier"
                | "ShutdownTask"
                | "PollForError"
                | "GetAliveTasks"
                | "WatchTasks"
        ),
        // A new member catches up before it is added. TF's consumers wait for one another to
        // remove a task; a new iteration's tasks are pushed to its workers before it answers.
        None => matches!(
            method,
            "GetKeyValue"
                | "Barrier"
                | "WaitForAllTasks"
                | "ShutdownTask"
                | "PollForError"
                | "GetAliveTasks"
                | "WatchJobState"
                | "coordination/PollForError"
                | "coordination/AwaitBarrier"
                | "coordination/AwaitAlive"
                | "AddMember"
                | "RemoveMember"
                | "tfdata/MaybeRemoveTask"
                | "tfdata/GetOrCreateIteration"
                | "raw/Wait"
                | "raw/Barrier"
                | "raw/QueuePop"
        ),
    }
}

/// The RPCs of `tensorflow.CoordinationService` (TF 2.21), by the names routing knows them by.
const TF_METHODS: [&str; 19] = [
    "RegisterTask",
    "Heartbeat",
    "WaitForAllTasks",
    "ShutdownTask",
    "ResetTask",
    "ReportErrorToTask",
    "ReportErrorToService",
    "GetTaskState",
    "WatchJobState",
    "InsertKeyValue",
    "GetKeyValue",
    "TryGetKeyValue",
    "IncrementKeyValue",
    "GetKeyValueDir",
    "DeleteKeyValue",
    "Barrier",
    "CancelBarrier",
    "GetAliveTasks",
    "PollForError",
];

/// Whether `method`'s callers are TensorFlow's or jaxlib's own clients, which take `UNAVAILABLE`
/// as fatal (TF's agent retries none of its calls but RegisterTask, jaxlib none at all; TF's
/// tf.data clients and workers give up on a dispatcher that stays unavailable): without the mark
/// coord's own clients send, such a call is held until a leader serves it.
pub(super) fn surface_of_agents_that_never_retry(method: &str) -> bool {
    method.starts_with("xla/") || method.starts_with("tfdata/") || TF_METHODS.contains(&method)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_timeout(v: &str) -> Request<()> {
        let mut r = Request::new(());
        r.metadata_mut()
            .insert("grpc-timeout", v.parse().expect("ascii"));
        r
    }

    /// A sidecar's waits on barriers and GetAliveTasks rounds park for as long as the slowest
    /// task takes: a follower relaying one must not cut it off after its quick-call timeout (the
    /// sidecar would send it again every 2 s). Recording arrivals answers at once.
    #[test]
    fn a_sidecars_waits_wait_and_its_recordings_do_not() {
        for m in [
            "coordination/AwaitBarrier",
            "coordination/AwaitAlive",
            "coordination/PollForError",
        ] {
            assert!(waits_on_the_service(m), "{m}");
        }
        for m in [
            "coordination/BarrierArrivals",
            "coordination/XlaAliveAsks",
            "coordination/Heartbeats",
        ] {
            assert!(!waits_on_the_service(m), "{m}");
        }
    }

    #[test]
    fn caller_deadlines_are_read_in_every_unit() {
        assert_eq!(
            caller_deadline(&with_timeout("300m")),
            Some(Duration::from_millis(300))
        );
        assert_eq!(
            caller_deadline(&with_timeout("2S")),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            caller_deadline(&with_timeout("1M")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            caller_deadline(&with_timeout("1H")),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            caller_deadline(&with_timeout("5u")),
            Some(Duration::from_micros(5))
        );
        assert_eq!(
            caller_deadline(&with_timeout("7n")),
            Some(Duration::from_nanos(7))
        );
        assert_eq!(caller_deadline(&with_timeout("")), None);
        assert_eq!(caller_deadline(&with_timeout("m")), None);
        assert_eq!(caller_deadline(&with_timeout("12x")), None);
        assert_eq!(caller_deadline(&Request::new(())), None);
    }
}
