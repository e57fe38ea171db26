//! Where an armed /dev/fuse helper thread runs: off the first queue
//! thread's CPU while the helper takes requests, anywhere its affinity
//! allowed at start once it stops.
//!
//! A helper that wakes on the CPU it last ran on usually shares that CPU
//! with the first thread, which never sleeps long under load. The two
//! readers then take turns on one vCPU while the other runs only the
//! application. Measured on the 2-CPU machine at four jobs x depth 1
//! (docs/performance.md, "What explains the limits"): 93
//! MiB/s median with both threads free, against 101 and 106 with the two
//! threads pinned to different CPUs either way round (eight alternating
//! rounds). Pinning the first thread costs depth 1 a quarter of its speed
//! when the application runs on the other CPU, so the first thread stays
//! free, and only a helper moves, only while it reads.
//!
//! Enters as the first thread's CPU, which the first thread publishes
//! after each batch it reads ([`super::reader_gate::ReaderGate::note_primary_cpu`]);
//! leaves as the helper's own affinity (`sched_setaffinity` on the
//! calling thread). The universe is the helper's affinity when it was
//! created, so a daemon started under `taskset` keeps to its CPUs. With
//! one CPU there, nothing changes. A refused change (a cpuset changed
//! since) is logged at debug level, and the helper stays where it is and
//! stops trying.

/// One helper's placement.
pub struct HelperCpu {
    /// The CPUs the thread may use at all (its affinity at start).
    universe: libc::cpu_set_t,
    /// The first thread's CPU the helper is kept off now, if any.
    avoiding: Option<usize>,
    /// The kernel refused a change: leave the affinity alone from now on.
    refused: bool,
}

/// Whether `cpu` is in `set` (false past the set's size).
fn has(set: &libc::cpu_set_t, cpu: usize) -> bool {
    // SAFETY: `cpu` is below CPU_SETSIZE, the number of bits of a
    // cpu_set_t, so the macro reads inside `set`.
    cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, set) }
}

/// The CPUs of `universe` except `cpu`; None when that leaves none or
/// `cpu` is not among them (nothing to avoid).
pub fn without(universe: &libc::cpu_set_t, cpu: usize) -> Option<libc::cpu_set_t> {
    if !has(universe, cpu) {
        return None;
    }
    let mut rest = *universe;
    // SAFETY: `cpu` is below CPU_SETSIZE (`has` checked it), so the macro
    // writes inside `rest`.
    unsafe { libc::CPU_CLR(cpu, &mut rest) };
    // SAFETY: counts the bits of a valid cpu_set_t.
    let left = unsafe { libc::CPU_COUNT(&rest) };
    (left > 0).then_some(rest)
}

fn set_affinity(set: &libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is
    // the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The CPU the calling thread runs on now (None if the kernel cannot
/// say).
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

impl HelperCpu {
    /// The calling thread's placement, its current affinity as the
    /// universe.
    pub fn of_current_thread() -> std::io::Result<Self> {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut universe: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `universe` is a writable cpu_set_t of the size passed.
        let rc = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut universe)
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(HelperCpu {
            universe,
            avoiding: None,
            refused: false,
        })
    }

    /// The helper reads: keeps off `primary` (the first thread's CPU as
    /// last published). Makes a system call only when that CPU changed.
    pub fn keep_off(&mut self, primary: Option<usize>) {
        if self.refused || primary.is_none() || primary == self.avoiding {
            return;
        }
        let Some(rest) = primary.and_then(|cpu| without(&self.universe, cpu)) else {
            self.release();
            return;
        };
        match set_affinity(&rest) {
            Ok(()) => self.avoiding = primary,
            Err(e) => {
                log::debug!("fuse: moving a queue helper off CPU {primary:?}: {e}");
                self.refused = true;
            }
        }
    }

    /// The helper stopped reading: every CPU of the universe again.
    pub fn release(&mut self) {
        if self.avoiding.is_none() {
            return;
        }
        if let Err(e) = set_affinity(&self.universe) {
            log::debug!("fuse: giving a queue helper back its CPUs: {e}");
            self.refused = true;
        }
        self.avoiding = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_of(cpus: &[usize]) -> libc::cpu_set_t {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cpus {
            assert!(c < libc::CPU_SETSIZE as usize);
            // SAFETY: `c` is below CPU_SETSIZE (asserted).
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        set
    }

    fn members(set: &libc::cpu_set_t) -> Vec<usize> {
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| has(set, c))
            .collect()
    }

    #[test]
    fn a_helper_avoids_only_a_cpu_it_may_use_and_never_loses_them_all() {
        let two = set_of(&[0, 1]);
        assert_eq!(members(&without(&two, 1).unwrap()), vec![0]);
        assert_eq!(members(&without(&two, 0).unwrap()), vec![1]);
        // A CPU outside the universe: nothing to avoid.
        assert!(without(&two, 5).is_none());
        assert!(without(&two, 100_000).is_none());
        // One CPU: the helper keeps it.
        assert!(without(&set_of(&[3]), 3).is_none());
        let four = set_of(&[0, 2, 4, 6]);
        assert_eq!(members(&without(&four, 4).unwrap()), vec![0, 2, 6]);
    }

    #[test]
    fn keep_off_moves_the_thread_and_release_restores_it() {
        // Runs on its own thread so the test harness keeps its affinity.
        std::thread::spawn(|| {
            let mut placement = HelperCpu::of_current_thread().unwrap();
            let universe = members(&placement.universe);
            let Some(&first) = universe.first() else {
                panic!("a thread with no CPUs");
            };
            placement.keep_off(Some(first));
            let now = HelperCpu::of_current_thread().unwrap();
            if universe.len() > 1 {
                assert_eq!(members(&now.universe), universe[1..].to_vec());
                assert_ne!(current_cpu(), Some(first));
            } else {
                assert_eq!(members(&now.universe), universe);
            }
            placement.release();
            let back = HelperCpu::of_current_thread().unwrap();
            assert_eq!(members(&back.universe), universe);
        })
        .join()
        .unwrap();
    }
}
