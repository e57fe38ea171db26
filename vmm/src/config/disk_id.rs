//! The ids of disks given none, as Cloud Hypervisor names them
//! (`_disk0`, `_disk1`, ...): for the disks of a `VmConfig`
//! ([`super::boot_config`]) and for those added later (the VMM's disk
//! registry).

/// The id of the `n`-th disk that was given none (Cloud Hypervisor's
/// names: `_disk0`, `_disk1`, ...).
pub fn default_disk_id(n: usize) -> String {
    format!("_disk{n}")
}

/// The first default id not in `taken`, counting from `*next` (which is
/// left past it).
pub fn next_free_disk_id(next: &mut usize, taken: &[&str]) -> String {
    loop {
        let id = default_disk_id(*next);
        *next += 1;
        if !taken.contains(&id.as_str()) {
            return id;
        }
    }
}
