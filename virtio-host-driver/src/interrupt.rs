//! A [`VirtioInterrupt`] for the host-side driver: one eventfd per queue.
//!
//! The device's worker threads call [`VirtioInterrupt::trigger`]; the
//! driver waits on the queue's eventfd ([`EventFdInterrupt::wait`]), or
//! first spins on the count of raised interrupts the way a halted vCPU
//! spins in KVM before it sleeps ([`EventFdInterrupt::wait_polling`]);
//! tests read how many interrupts each queue raised.

use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use block::padded::CachePadded;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use virtio_devices::device::{InterruptKind, VirtioInterrupt};

/// Counts and signals interrupts per queue.
pub struct EventFdInterrupt {
    queues: Vec<EventFd>,
    /// Per queue, on cache lines of its own: queue N's worker and driver
    /// write only these, so queues share no written line (two queues'
    /// counters side by side made every interrupt a cache miss for the
    /// other queues' threads).
    counters: Vec<CachePadded<QueueCounters>>,
    config: AtomicU64,
}

#[derive(Default)]
struct QueueCounters {
    /// Interrupts raised.
    raised: AtomicU64,
    /// Interrupts the driver has consumed (eventfd reads add the counter
    /// they took): fewer than `raised` means one is pending.
    consumed: AtomicU64,
}

impl EventFdInterrupt {
    pub fn new(num_queues: u16) -> io::Result<Self> {
        let mut queues = Vec::new();
        let mut counters = Vec::new();
        for _ in 0..num_queues {
            queues.push(EventFd::new(EFD_NONBLOCK)?);
            counters.push(CachePadded::default());
        }
        Ok(EventFdInterrupt {
            queues,
            counters,
            config: AtomicU64::new(0),
        })
    }

    /// Interrupts raised for `queue` so far.
    pub fn count(&self, queue: u16) -> u64 {
        self.counters
            .get(usize::from(queue))
            .map_or(0, |c| c.raised.load(Ordering::SeqCst))
    }

    /// Config-change interrupts raised so far.
    pub fn config_count(&self) -> u64 {
        self.config.load(Ordering::SeqCst)
    }

    /// The eventfd a queue's interrupts land on.
    pub fn eventfd(&self, queue: u16) -> Option<&EventFd> {
        self.queues.get(usize::from(queue))
    }

    /// Waits up to `timeout` for an interrupt on `queue` and consumes it;
    /// returns whether one came.
    pub fn wait(&self, queue: u16, timeout: Duration) -> io::Result<bool> {
        let fd = self
            .eventfd(queue)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no such queue"))?;
        // poll first: it returns at once when an interrupt is pending, so
        // a wait costs two syscalls (poll, read) instead of three.
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `pfd` is a valid pollfd for the duration of the call and
        // the count passed is 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(self.consume(queue, fd))
    }

    /// Like [`EventFdInterrupt::wait`], but first spins for up to `spin`
    /// until an interrupt is pending, checking memory only (as KVM's halt
    /// polling checks for a pending interrupt before it puts a halted
    /// vCPU to sleep; `halt_poll_ns` is 200 us by default on x86). An
    /// interrupt raised during the spin is taken without a sleep and
    /// wake-up.
    pub fn wait_polling(&self, queue: u16, spin: Duration, timeout: Duration) -> io::Result<bool> {
        let q = usize::from(queue);
        if let (Some(fd), Some(c)) = (self.queues.get(q), self.counters.get(q)) {
            let deadline = Instant::now() + spin;
            loop {
                // The count goes up just before the eventfd write: a read
                // in between finds nothing and the blocking wait takes it.
                if c.raised.load(Ordering::SeqCst) != c.consumed.load(Ordering::SeqCst)
                    && self.consume(queue, fd)
                {
                    return Ok(true);
                }
                if spin.is_zero() || Instant::now() >= deadline {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        self.wait(queue, timeout)
    }

    /// Reads (clears) the queue's eventfd; whether there was an interrupt.
    fn consume(&self, queue: u16, fd: &EventFd) -> bool {
        match fd.read() {
            Ok(n) => {
                if let Some(c) = self.counters.get(usize::from(queue)) {
                    c.consumed.fetch_add(n, Ordering::SeqCst);
                }
                true
            }
            Err(_) => false,
        }
    }
}

impl VirtioInterrupt for EventFdInterrupt {
    fn trigger(&self, kind: InterruptKind) -> io::Result<()> {
        match kind {
            InterruptKind::Config => {
                self.config.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            InterruptKind::Queue(q) => {
                let i = usize::from(q);
                let fd = self
                    .queues
                    .get(i)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no such queue"))?;
                if let Some(c) = self.counters.get(i) {
                    c.raised.fetch_add(1, Ordering::SeqCst);
                }
                fd.write(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const LONG: Duration = Duration::from_secs(5);

    #[test]
    fn a_pending_interrupt_is_taken_once_with_or_without_a_spin() {
        let irq = EventFdInterrupt::new(1).unwrap();
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        // Both raised interrupts are consumed by one take.
        assert!(irq.wait_polling(0, Duration::ZERO, LONG).unwrap());
        assert!(!irq
            .wait_polling(0, Duration::from_millis(1), Duration::ZERO)
            .unwrap());
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        assert!(irq.wait(0, LONG).unwrap());
        assert!(!irq
            .wait_polling(0, Duration::from_millis(1), Duration::ZERO)
            .unwrap());
        assert_eq!(irq.count(0), 3);
    }

    #[test]
    fn the_spin_takes_an_interrupt_raised_while_it_lasts() {
        let irq = Arc::new(EventFdInterrupt::new(1).unwrap());
        let raiser = Arc::clone(&irq);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            raiser.trigger(InterruptKind::Queue(0)).unwrap();
        });
        // A 5 s spin and no sleep: the interrupt 2 ms in ends it.
        let start = Instant::now();
        assert!(irq.wait_polling(0, LONG, Duration::ZERO).unwrap());
        assert!(start.elapsed() < Duration::from_secs(4));
        t.join().unwrap();
    }
}
