//! XLA's WatchTasks, answered from one encoding per task version.
//!
//! A watcher is answered every task's record, and a change of any task answers every watcher:
//! a job of N watching processes is sent N answers of N records per change. (jaxlib 0.10.2
//! holds a runtime-client thread, `global_process_info`, that keeps a WatchTasks call open in
//! every process whose client is built with the distributed client; its CPU client, as our tests
//! start it, does not watch.) Built and encoded for each watcher, 10,000 watchers of one change
//! cost the leader 23 s of CPU. The records of a version are one list every watcher shares (see
//! `serve::coordination::CoordCore::watched`); here that list is encoded once (and gzipped once,
//! for the callers that accept gzip) and every watcher's response body is that buffer, by
//! reference, as GetAliveTasks' is (see [`crate::api::shared_answer`]).
//! A follower relays the leader's bytes, kept by their bytes for its other watchers of the same
//! version.

use coord_proto::xla::coordination as xla;
use tonic::{Request, Response, Status};

use super::errors::{error_payload, id_of};
use super::{answered_from_shared, served, state_of, XlaService};
use crate::api::shared_answer::AnswerBytes;
use crate::error::grpc_code;
use crate::serve::coordination::JobTasks;
use crate::serve::route::Kind;

/// jaxlib's WatchTasks, as a follower relays it to the leader.
const WATCH_TASKS: &str = "/xla.coordination.CoordinationService/WatchTasks";

impl XlaService {
    /// WatchTasks: the job's task records and their version, once the version differs from the
    /// caller's.
    pub(super) async fn watch_tasks_call(
        &self,
        req: Request<xla::WatchTasksRequest>,
    ) -> Result<Response<xla::WatchTasksResponse>, Status> {
        let this = self;
        let routed = self
            .router
            .route(
                "xla/WatchTasks",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let (job, _) = this.job()?;
                        let tasks = this.coord.watch_tasks(&job, m.version_number).await?;
                        Ok(this.watched.of(&tasks, encode))
                    })
                },
                |ch, r| this.relay(ch, r, WATCH_TASKS),
            )
            .await;
        answered_from_shared(routed)
    }
}

/// A version's answer on jaxlib's wire.
fn encode(tasks: &JobTasks) -> AnswerBytes {
    let task_state = tasks
        .records
        .iter()
        .map(|(t, r)| xla::TaskInfo {
            task_id: id_of(t),
            incarnation: r.incarnation,
            state: state_of(r.state) as i32,
            error_code: r.error.as_ref().map_or(0, |e| grpc_code(e.code) as i32),
            error_message: r
                .error
                .as_ref()
                .map_or_else(String::new, |e| e.message.clone()),
            error_payload: r.error.as_ref().map(error_payload),
        })
        .collect();
    AnswerBytes::encode(&xla::WatchTasksResponse {
        task_state,
        version_number: tasks.version,
    })
}
