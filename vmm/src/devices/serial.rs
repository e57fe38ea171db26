//! The 8250 UART at 0x3F8 (vm-superio), its output going to stdout, a
//! file or nowhere, and its interrupt to IRQ 4 through a KVM irqfd.
//!
//! Guest port accesses enter through [`BusDevice`]; bytes the guest writes
//! leave through the configured writer. With `--serial tty`, bytes read
//! from the VMM's stdin enter the receive FIFO of the VM's port
//! ([`forward_stdin`]; one reader thread for the process, whichever VM
//! owns the terminal). The port outlives a reboot: its output goes on
//! where it was.

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// Raises the serial IRQ by writing its irqfd.
pub struct IrqfdTrigger(pub EventFd);

impl Trigger for IrqfdTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Output that flushes every write, so the log is complete even if the
/// VMM is killed.
pub struct FlushingWriter(pub Box<dyn Write + Send>);

impl Write for FlushingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.0.write(buf)?;
        self.0.flush()?;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

pub struct SerialPort {
    uart: Serial<IrqfdTrigger, vm_superio::serial::NoEvents, FlushingWriter>,
}

impl SerialPort {
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        SerialPort {
            uart: Serial::new(IrqfdTrigger(irq), FlushingWriter(out)),
        }
    }
}

impl BusDevice for SerialPort {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        // Registers are 8 bits wide and 8 of them; offset < 8 on this bus.
        let v = self.uart.read(offset as u8);
        data.fill(0);
        if let Some(b) = data.first_mut() {
            *b = v;
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        if let Some(&b) = data.first() {
            if let Err(e) = self.uart.write(offset as u8, b) {
                log::warn!("serial write failed: {e:?}");
            }
        }
    }
}

impl SerialPort {
    /// Queues input bytes; returns how many fit in the receive FIFO.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        self.uart.enqueue_raw_bytes(bytes).unwrap_or(0)
    }
}

/// The port stdin goes to (`None`: no VM owns the terminal).
static STDIN_TARGET: Mutex<Option<Arc<Mutex<SerialPort>>>> = Mutex::new(None);
/// Whether the reader thread started (once per process).
static STDIN_READER: OnceLock<()> = OnceLock::new();

/// Sends what is typed on the VMM's stdin to `port` from now on (or to
/// nobody, with `None`), starting the reader thread the first time (it
/// runs under the main thread's seccomp filter).
pub fn forward_stdin(
    port: Option<Arc<Mutex<SerialPort>>>,
    seccomp: crate::config::SeccompMode,
) -> io::Result<()> {
    let starting = port.is_some() && STDIN_READER.get().is_none();
    *STDIN_TARGET.lock().unwrap_or_else(PoisonError::into_inner) = port;
    if !starting {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("serial-stdin".into())
        .spawn(move || {
            if let Err(e) = crate::seccomp::apply(crate::seccomp::ThreadKind::Main, seccomp) {
                log::error!("serial input disabled: {e}");
                return;
            }
            read_stdin();
        })?;
    let _ = STDIN_READER.set(());
    Ok(())
}

/// Forwards stdin to the current target until EOF.
fn read_stdin() {
    let mut buf = [0u8; 64];
    let mut stdin = io::stdin().lock();
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!("serial input stopped: {e}");
                return;
            }
        };
        let mut pending = &buf[..n];
        while !pending.is_empty() {
            let target = STDIN_TARGET
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            // Typed while no VM owns the terminal: dropped.
            let Some(port) = target else { break };
            let taken = port
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .enqueue_input(pending);
            pending = pending.get(taken..).unwrap_or_default();
            if taken == 0 {
                // FIFO full: the guest has not read yet.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn output_and_input() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let sink = Sink::default();
        let mut port = SerialPort::new(irq.try_clone().unwrap(), Box::new(sink.clone()));
        for b in b"ok\n" {
            port.write(0x3f8, 0, &[*b]);
        }
        assert_eq!(*sink.0.lock().unwrap(), b"ok\n");
        // Enable the "data available" interrupt, then feed input.
        port.write(0x3f8, 1, &[1]);
        assert_eq!(port.enqueue_input(b"x"), 1);
        assert_eq!(irq.read().unwrap(), 1, "receive interrupt raised");
        let mut lsr = [0u8];
        port.read(0x3f8, 5, &mut lsr);
        assert_eq!(lsr[0] & 1, 1, "data ready");
        let mut rbr = [0u8];
        port.read(0x3f8, 0, &mut rbr);
        assert_eq!(rbr[0], b'x');
    }
}
