//! One thread per activated vhost-user device that waits on the call
//! eventfds given to the backend (SET_VRING_CALL) and raises the matching
//! queue interrupt through the transport's [`VirtioInterrupt`], so MSI-X
//! vector choice and masking stay where they are for every device.
//!
//! Enters as (queue index, call eventfd) pairs and the interrupt handle;
//! leaves as interrupts. [`CallForwarder::stop`] (or drop) ends the thread.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::device::{InterruptKind, VirtioInterrupt};

/// The epoll token of the stop eventfd (queue tokens are queue indexes).
const STOP_TOKEN: u64 = u64::MAX;

pub struct CallForwarder {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl CallForwarder {
    /// Starts the thread forwarding each call eventfd of `calls` to
    /// `interrupt` as its queue's interrupt.
    pub fn start(
        calls: Vec<(u16, EventFd)>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> io::Result<Self> {
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP_TOKEN),
        )?;
        for (index, call) in &calls {
            epoll.ctl(
                ControlOperation::Add,
                call.as_raw_fd(),
                EpollEvent::new(EventSet::IN, u64::from(*index)),
            )?;
        }
        let stop_clone = stop.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("vu-blk-call".into())
            .spawn(move || forward(&epoll, &calls, &*interrupt, stop_clone))?;
        Ok(CallForwarder {
            stop,
            thread: Some(thread),
        })
    }

    /// Ends the thread and waits for it.
    pub fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            if let Err(e) = self.stop.write(1) {
                log::error!("vhost-user-blk: cannot stop the call forwarder: {e}");
                return;
            }
            if thread.join().is_err() {
                log::error!("vhost-user-blk: the call forwarder panicked");
            }
        }
    }
}

impl Drop for CallForwarder {
    fn drop(&mut self) {
        self.stop();
    }
}

fn forward(
    epoll: &Epoll,
    calls: &[(u16, EventFd)],
    interrupt: &dyn VirtioInterrupt,
    _stop: EventFd,
) {
    let mut events = vec![EpollEvent::default(); calls.len() + 1];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("vhost-user-blk: call forwarder epoll: {e}");
                return;
            }
        };
        for event in &events[..n] {
            let token = event.data();
            if token == STOP_TOKEN {
                return;
            }
            let Some((index, call)) = calls.iter().find(|(i, _)| u64::from(*i) == token) else {
                continue;
            };
            match call.read() {
                Ok(_) => {
                    if let Err(e) = interrupt.trigger(InterruptKind::Queue(*index)) {
                        log::error!("vhost-user-blk: queue {index} interrupt: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => log::error!("vhost-user-blk: queue {index} call eventfd: {e}"),
            }
        }
    }
}
