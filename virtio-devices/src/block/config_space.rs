//! virtio-blk configuration: the options a VMM gives a [`super::BlockDevice`]
//! and the device-specific config space the driver reads.
//!
//! Data enters as a [`BlockDeviceConfig`] plus the disk's size and
//! read-only flag; it leaves as the little-endian `struct virtio_blk_config`
//! bytes of virtio 1.2 section 5.2.4, served by [`ConfigSpace::read`].
//! The only field a driver may write is `writeback` (CONFIG_WCE).

/// Byte offsets of `struct virtio_blk_config` (virtio 1.2, 5.2.4).
pub mod offset {
    pub const CAPACITY: usize = 0;
    pub const SEG_MAX: usize = 12;
    pub const BLK_SIZE: usize = 20;
    pub const PHYSICAL_BLOCK_EXP: usize = 24;
    pub const ALIGNMENT_OFFSET: usize = 25;
    pub const MIN_IO_SIZE: usize = 26;
    pub const OPT_IO_SIZE: usize = 28;
    pub const WRITEBACK: usize = 32;
    pub const NUM_QUEUES: usize = 34;
    pub const MAX_DISCARD_SECTORS: usize = 36;
    pub const MAX_DISCARD_SEG: usize = 40;
    pub const DISCARD_SECTOR_ALIGNMENT: usize = 44;
    pub const MAX_WRITE_ZEROES_SECTORS: usize = 48;
    pub const MAX_WRITE_ZEROES_SEG: usize = 52;
    pub const WRITE_ZEROES_MAY_UNMAP: usize = 56;
    /// Up to and including `unused1[3]`; the secure-erase and zoned fields
    /// after it are not offered and read as zero.
    pub const END: usize = 60;
}

/// Offset of the `writeback` byte, the only driver-writable field.
pub const WRITEBACK_OFFSET: u64 = offset::WRITEBACK as u64;

/// Largest discard or write-zeroes request, in 512-byte sectors (2 GiB).
pub const MAX_DISCARD_SECTORS: u32 = 1 << 22;

/// How the VMM wants the device set up.
#[derive(Clone, Debug)]
pub struct BlockDeviceConfig {
    /// Number of virtqueues (one worker thread each); at least 1.
    pub num_queues: u16,
    /// Maximum size of each queue (a power of two, at most 32768).
    pub queue_size: u16,
    /// Answer to GET_ID: up to 20 bytes, longer serials are cut.
    pub serial: Vec<u8>,
    /// The disk's logical block size (blk_size), a power of two >= 512.
    pub logical_block_size: u32,
    /// The physical block size (topology), a power-of-two multiple of the
    /// logical one.
    pub physical_block_size: u32,
    /// Optimal I/O size in bytes (topology opt_io_size), e.g. the qcow2
    /// cluster size; 0 when unknown.
    pub optimal_io_size: u32,
    /// Most data segments per request; `None` means `queue_size - 2`.
    pub seg_max: Option<u32>,
    /// The longest a queue worker spins for work before it sleeps, in
    /// microseconds (0: never; at most 1000; default [`DEFAULT_POLL_US`]).
    /// The spin adapts below it and stops on an idle queue (see
    /// `ch_util::adaptive_poll`, docs/disk-options.md "Polling").
    pub poll_us: u32,
    /// I/O throttling per queue (none by default).
    pub rate_limit: super::rate_limit::RateLimitConfig,
    /// Host CPUs each queue's worker thread may run on, by queue index
    /// (`None` or a missing entry: wherever the scheduler likes).
    pub queue_affinity: Vec<Option<Vec<usize>>>,
    /// Offer the disk read-only (VIRTIO_BLK_F_RO) even if the image is
    /// open for writing; a read-only image is always offered read-only.
    pub readonly: bool,
}

/// Default ceiling of a queue worker's adaptive spin: QEMU's iothread
/// default `poll-max-ns` (32768 ns), rounded.
pub const DEFAULT_POLL_US: u32 = 32;

impl Default for BlockDeviceConfig {
    fn default() -> Self {
        Self {
            num_queues: 1,
            queue_size: 256,
            serial: Vec::new(),
            logical_block_size: 512,
            physical_block_size: 512,
            optimal_io_size: 0,
            seg_max: None,
            poll_us: DEFAULT_POLL_US,
            rate_limit: Default::default(),
            queue_affinity: Vec::new(),
            readonly: false,
        }
    }
}

impl BlockDeviceConfig {
    /// The seg_max the device enforces and advertises (at least 1).
    pub fn effective_seg_max(&self) -> u32 {
        self.seg_max
            .unwrap_or_else(|| u32::from(self.queue_size).saturating_sub(2))
            .max(1)
    }

    /// The GET_ID answer: the serial cut to 20 bytes, zero padded.
    pub fn device_id(&self) -> [u8; 20] {
        let mut id = [0u8; 20];
        let n = self.serial.len().min(id.len());
        id[..n].copy_from_slice(&self.serial[..n]);
        id
    }
}

/// The device-specific config space of one virtio-blk device.
#[derive(Clone, Debug)]
pub struct ConfigSpace {
    bytes: [u8; offset::END],
}

impl ConfigSpace {
    /// Lays out the config space for a disk of `disk_size` bytes.
    pub fn new(config: &BlockDeviceConfig, disk_size: u64, readonly: bool) -> Self {
        let mut space = ConfigSpace {
            bytes: [0; offset::END],
        };
        let lbs = config.logical_block_size.max(512);
        let pbs = config.physical_block_size.max(lbs);
        space.put_u64(offset::CAPACITY, disk_size / block::SECTOR_SIZE);
        space.put_u32(offset::SEG_MAX, config.effective_seg_max());
        space.put_u32(offset::BLK_SIZE, lbs);
        // physical_block_exp: log2(physical blocks per logical block).
        let exp = (pbs / lbs).max(1).trailing_zeros();
        space.bytes[offset::PHYSICAL_BLOCK_EXP] = u8::try_from(exp).unwrap_or(0);
        space.bytes[offset::ALIGNMENT_OFFSET] = 0;
        // min_io_size and opt_io_size are in logical blocks.
        let min_io = u16::try_from(pbs / lbs).unwrap_or(1).max(1);
        space.put_u16(offset::MIN_IO_SIZE, min_io);
        space.put_u32(offset::OPT_IO_SIZE, config.optimal_io_size / lbs);
        space.bytes[offset::WRITEBACK] = 1;
        space.put_u16(offset::NUM_QUEUES, config.num_queues.max(1));
        if !readonly {
            let align = lbs / 512;
            space.put_u32(offset::MAX_DISCARD_SECTORS, MAX_DISCARD_SECTORS);
            space.put_u32(offset::MAX_DISCARD_SEG, 1);
            space.put_u32(offset::DISCARD_SECTOR_ALIGNMENT, align);
            space.put_u32(offset::MAX_WRITE_ZEROES_SECTORS, MAX_DISCARD_SECTORS);
            space.put_u32(offset::MAX_WRITE_ZEROES_SEG, 1);
            space.bytes[offset::WRITE_ZEROES_MAY_UNMAP] = 1;
        }
        space
    }

    fn put_u16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put_u32(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn put_u64(&mut self, at: usize, v: u64) {
        self.bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// Copies config bytes at `offset` into `data`; bytes past the end of
    /// the structure read as zero.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if start >= self.bytes.len() {
            return;
        }
        let n = data.len().min(self.bytes.len() - start);
        data[..n].copy_from_slice(&self.bytes[start..start + n]);
    }

    /// Applies a driver write; only the single `writeback` byte is
    /// writable. Returns false (and changes nothing) for any other write.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> bool {
        if offset == WRITEBACK_OFFSET && data.len() == 1 {
            self.bytes[offset::WRITEBACK] = u8::from(data[0] != 0);
            true
        } else {
            false
        }
    }

    /// Whether the device is in writeback mode (1) or writethrough (0).
    pub fn writeback(&self) -> bool {
        self.bytes[offset::WRITEBACK] != 0
    }

    /// Sets the capacity for a disk of `disk_size` bytes (after a resize).
    pub fn set_capacity(&mut self, disk_size: u64) {
        self.put_u64(offset::CAPACITY, disk_size / block::SECTOR_SIZE);
    }

    /// Capacity in 512-byte sectors.
    pub fn capacity_sectors(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.bytes[offset::CAPACITY..offset::CAPACITY + 8]);
        u64::from_le_bytes(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le32(space: &ConfigSpace, at: u64) -> u32 {
        let mut b = [0u8; 4];
        space.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn layout_matches_virtio_1_2() {
        let cfg = BlockDeviceConfig {
            num_queues: 4,
            queue_size: 128,
            logical_block_size: 4096,
            physical_block_size: 4096,
            optimal_io_size: 65536,
            ..Default::default()
        };
        let space = ConfigSpace::new(&cfg, 10 << 20, false);
        let mut cap = [0u8; 8];
        space.read(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), (10 << 20) / 512);
        assert_eq!(le32(&space, 12), 126);
        assert_eq!(le32(&space, 20), 4096);
        let mut topo = [0u8; 8];
        space.read(24, &mut topo);
        assert_eq!(topo[0], 0, "physical_block_exp");
        assert_eq!(u16::from_le_bytes([topo[2], topo[3]]), 1, "min_io_size");
        assert_eq!(u32::from_le_bytes([topo[4], topo[5], topo[6], topo[7]]), 16);
        let mut nq = [0u8; 2];
        space.read(34, &mut nq);
        assert_eq!(u16::from_le_bytes(nq), 4);
        assert_eq!(le32(&space, 36), MAX_DISCARD_SECTORS);
        assert_eq!(le32(&space, 40), 1);
        assert_eq!(le32(&space, 44), 8);
        assert_eq!(le32(&space, 48), MAX_DISCARD_SECTORS);
        assert_eq!(le32(&space, 52), 1);
        let mut unmap = [0u8; 1];
        space.read(56, &mut unmap);
        assert_eq!(unmap[0], 1);
    }

    #[test]
    fn reads_past_the_end_are_zero_and_do_not_panic() {
        let space = ConfigSpace::new(&BlockDeviceConfig::default(), 1 << 20, false);
        let mut buf = [0xffu8; 8];
        space.read(56, &mut buf);
        assert_eq!(buf, [1, 0, 0, 0, 0, 0, 0, 0]);
        space.read(u64::MAX, &mut buf);
        assert_eq!(buf, [0; 8]);
    }

    #[test]
    fn only_writeback_is_writable() {
        let mut space = ConfigSpace::new(&BlockDeviceConfig::default(), 1 << 20, false);
        assert!(space.writeback());
        assert!(space.write(WRITEBACK_OFFSET, &[0]));
        assert!(!space.writeback());
        assert!(!space.write(0, &[1, 2, 3, 4]));
        assert_eq!(space.capacity_sectors(), 2048);
    }

    #[test]
    fn serial_is_cut_to_twenty_bytes() {
        let cfg = BlockDeviceConfig {
            serial: b"0123456789abcdefghijKLMN".to_vec(),
            ..Default::default()
        };
        assert_eq!(&cfg.device_id(), b"0123456789abcdefghij");
    }
}
