//! State derived from records (the task registry's counts, a GetAliveTasks round's, the pending
//! barriers): kept so that a change costs that change and not a walk of every record, yet never
//! encoded (a decoded state derives it again) and equal to any other, so it is not part of the
//! state that replicas compare and snapshot.

#[derive(Clone, Debug, Default)]
pub(crate) struct Derived<T>(pub(crate) T);

impl<T> PartialEq for Derived<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> Eq for Derived<T> {}
