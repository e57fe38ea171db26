//! [`PlanCache`]: memory a queue lends its image's format from one read
//! plan to the next, so that planning a read of allocated data takes no
//! lock and writes nothing another queue reads or writes (qcow2 keeps
//! snapshots of its tables there, see `qcow2::planning::queue_view`).
//!
//! The queue owns the cache (the executor keeps one per queue); the format
//! decides what is in it. A cache starts empty and is filled by the
//! format's first [`super::Format::plan_read_cached`]; a value of another
//! type (a cache handed to a different format) is replaced, never
//! misread.

use std::any::Any;

/// See the module docs.
#[derive(Default)]
pub struct PlanCache {
    slot: Option<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache")
            .field("filled", &self.slot.is_some())
            .finish()
    }
}

impl PlanCache {
    /// The cached value of type `T`, made by `make` when the cache is
    /// empty or holds something else.
    pub fn get_or_insert_with<T: Any + Send>(&mut self, make: impl FnOnce() -> T) -> &mut T {
        if !self.slot.as_ref().is_some_and(|v| v.is::<T>()) {
            self.slot = Some(Box::new(make()));
        }
        match self.slot.as_mut().and_then(|v| v.downcast_mut::<T>()) {
            Some(v) => v,
            // Filled with a `T` just above.
            None => unreachable!("the plan cache holds a T"),
        }
    }

    /// Forgets whatever the format kept.
    pub fn clear(&mut self) {
        self.slot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_of_another_type_is_replaced() {
        let mut c = PlanCache::default();
        *c.get_or_insert_with(|| 1u32) += 1;
        assert_eq!(*c.get_or_insert_with(|| 0u32), 2);
        assert_eq!(c.get_or_insert_with(|| String::from("x")), "x");
        assert_eq!(*c.get_or_insert_with(|| 7u32), 7);
        c.clear();
        assert_eq!(*c.get_or_insert_with(|| 9u32), 9);
    }
}
