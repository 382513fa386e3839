//! Ownership of background loops: every loop a replica starts belongs to one [`TaskGuard`], and
//! dropping the guard stops them all. Shutdown is a type, not a convention.

use std::future::Future;

use tokio::task::JoinHandle;

#[derive(Default)]
pub struct TaskGuard {
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl TaskGuard {
    pub fn spawn(&mut self, name: &'static str, fut: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push((name, tokio::spawn(fut)));
    }

    /// Runs `fut` on the runtime of `on` (a loop that follows the Raft core runs beside it, see
    /// `replica`).
    pub fn spawn_on(
        &mut self,
        on: &tokio::runtime::Handle,
        name: &'static str,
        fut: impl Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.push((name, on.spawn(fut)));
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for (name, t) in &self.tasks {
            tracing::debug!(task = name, "stopping background task");
            t.abort();
        }
    }
}
