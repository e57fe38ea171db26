//! Puts the controlling terminal in raw-ish mode while the guest owns
//! the console (`--serial tty` with stdin a terminal): no line buffering
//! and no local echo, so keys reach the guest one by one and the guest
//! echoes them. Signals (Ctrl-C) still reach the VMM, which then shuts
//! the VM down cleanly. The old settings come back on drop.

use std::io;

pub struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    /// `Ok(None)` when stdin is not a terminal.
    pub fn enter() -> io::Result<Option<RawTerminal>> {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1 {
            return Ok(None);
        }
        // SAFETY: termios is plain data; tcgetattr fills it in.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and a valid pointer to our struct.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ECHONL | libc::IEXTEN);
        raw.c_iflag &= !(libc::ICRNL | libc::IXON);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: valid descriptor and a valid pointer to our struct.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(RawTerminal { saved }))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restoring the settings read in `enter` on the same fd.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.saved) };
    }
}
