//! A minimal MC146818 CMOS/RTC at ports 0x70 (index) and 0x71 (data):
//! the current UTC time in BCD, 24-hour mode, "update not in progress",
//! "valid RAM and time"; other registers are plain RAM. No alarm, no
//! periodic interrupt. Linux reads the wall clock from it at boot.
//!
//! Guest port accesses enter through [`BusDevice`]; the time comes from
//! the host clock at each read.

use std::time::{SystemTime, UNIX_EPOCH};

use super::bus::BusDevice;

const SECONDS: usize = 0x00;
const MINUTES: usize = 0x02;
const HOURS: usize = 0x04;
const WEEKDAY: usize = 0x06;
const DAY: usize = 0x07;
const MONTH: usize = 0x08;
const YEAR: usize = 0x09;
const STATUS_A: usize = 0x0a;
const STATUS_B: usize = 0x0b;
const STATUS_C: usize = 0x0c;
const STATUS_D: usize = 0x0d;
const CENTURY: usize = 0x32;

pub struct Cmos {
    index: u8,
    ram: [u8; 128],
    now: fn() -> u64,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn bcd(v: u64) -> u8 {
    // Callers pass values below 100.
    (((v / 10) << 4) | (v % 10)) as u8
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01
/// (the "civil from days" algorithm for the proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u64, u64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl Cmos {
    pub fn new() -> Self {
        Self::with_clock(unix_now)
    }

    fn with_clock(now: fn() -> u64) -> Self {
        let mut ram = [0u8; 128];
        ram[STATUS_A] = 0x26; // 32.768 kHz time base, 1.024 kHz rate, UIP clear
        ram[STATUS_B] = 0x02; // 24-hour, BCD, no interrupts
        ram[STATUS_D] = 0x80; // valid RAM and time
        Cmos { index: 0, ram, now }
    }

    fn read_register(&self, reg: usize) -> u8 {
        let t = (self.now)();
        let days = (t / 86_400) as i64;
        let secs = t % 86_400;
        let (year, month, day) = civil_from_days(days);
        let year = year.max(0) as u64;
        match reg {
            SECONDS => bcd(secs % 60),
            MINUTES => bcd(secs / 60 % 60),
            HOURS => bcd(secs / 3600),
            // 1970-01-01 was a Thursday; the RTC counts Sunday as 1.
            WEEKDAY => bcd(((days + 4).rem_euclid(7) + 1) as u64),
            DAY => bcd(day),
            MONTH => bcd(month),
            YEAR => bcd(year % 100),
            CENTURY => bcd(year / 100 % 100),
            STATUS_C => 0,
            r => self.ram.get(r).copied().unwrap_or(0),
        }
    }
}

impl Default for Cmos {
    fn default() -> Self {
        Self::new()
    }
}

impl BusDevice for Cmos {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let v = match offset {
            0 => self.index,
            _ => self.read_register(usize::from(self.index & 0x7f)),
        };
        if let Some(b) = data.first_mut() {
            *b = v;
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        let Some(&v) = data.first() else { return };
        if offset == 0 {
            // Bit 7 is the NMI mask; we keep it for reads only.
            self.index = v;
            return;
        }
        let reg = usize::from(self.index & 0x7f);
        // Time and status registers are not settable; the rest is RAM.
        if reg > STATUS_D && reg != CENTURY {
            self.ram[reg] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(c: &mut Cmos, r: u8) -> u8 {
        c.write(0x70, 0, &[r]);
        let mut b = [0u8];
        c.read(0x70, 1, &mut b);
        b[0]
    }

    #[test]
    fn reports_a_known_time_in_bcd() {
        // 2026-11-22 05:43:07 UTC, a Sunday.
        let mut c = Cmos::with_clock(|| 1_795_326_187);
        assert_eq!(reg(&mut c, 0x09), 0x26);
        assert_eq!(reg(&mut c, 0x32), 0x20);
        assert_eq!(reg(&mut c, 0x08), 0x11);
        assert_eq!(reg(&mut c, 0x07), 0x22);
        assert_eq!(reg(&mut c, 0x06), 0x01);
        assert_eq!(reg(&mut c, 0x04), 0x05);
        assert_eq!(reg(&mut c, 0x02), 0x43);
        assert_eq!(reg(&mut c, 0x00), 0x07);
        assert_eq!(reg(&mut c, 0x0a) & 0x80, 0, "update in progress clear");
        assert_eq!(reg(&mut c, 0x0d), 0x80);
    }

    #[test]
    fn ram_is_writable_and_time_is_not() {
        let mut c = Cmos::new();
        c.write(0x70, 0, &[0x40]);
        c.write(0x70, 1, &[0x5a]);
        assert_eq!(reg(&mut c, 0x40), 0x5a);
        c.write(0x70, 0, &[0x0b]);
        c.write(0x70, 1, &[0xff]);
        assert_eq!(reg(&mut c, 0x0b), 0x02);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
