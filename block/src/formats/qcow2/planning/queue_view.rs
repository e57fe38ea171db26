//! A queue's view of a qcow2 image's tables: read plans of allocated
//! clusters without the image lock and without writing anything another
//! queue reads or writes.
//!
//! The view lives in the queue's [`PlanCache`] (one per queue, kept by the
//! executor). It holds [`Snapshot`]s of the L1 table and of the L2 tables
//! the queue has read, each taken under the image lock together with the
//! file size at that moment (the bound its entries are checked against).
//! A lookup reads the snapshots' "retired" flags (set by the writer that
//! replaced or evicted that version, see `published`), and if both are
//! current it decodes the entry from the snapshot: no lock, no shared
//! write, no LRU bookkeeping. A retired snapshot, a table the view does
//! not hold yet, or an L1 entry that needs checking sends that one lookup
//! through the lock once (`refresh`), which loads the table into the
//! image's cache if needed and takes a fresh snapshot.
//!
//! Flow of [`QueueView::plan_read`]: clusters in order; a mapped one
//! becomes its piece ([`ReadPlanner::piece_of`], the same code as the
//! locked path); unallocated ranges are gathered and planned by the
//! backing image (through its own view, kept inside this one) or read as
//! zeroes. Images whose compressed-write cache may hold clusters (only
//! `ch-img convert -c` writes them) take the locked path for every read
//! (the image's `Format::plan_read_cached` decides).
//!
//! Bounded: at most as many L2 snapshots as the image's L2 cache holds
//! tables; a full view is emptied and refilled (a workload whose tables do
//! not fit the cache reloads them under the lock anyway).

use foldhash::{HashMap, HashMapExt};
use std::sync::Mutex;

use super::read::{push_piece, ReadPlanner};
use crate::error::BlockError;
use crate::formats::qcow2::metadata::published::Snapshot;
use crate::formats::qcow2::on_disk::geometry::{checked_entry, raw_entry, ImageGeometry};
use crate::formats::qcow2::on_disk::l2_entry::decode_l1;
use crate::formats::qcow2::state::{lock, State};
use crate::formats::{PlanCache, ReadPiece, ReadPlan, ReadSource};

/// One L2 table as the view holds it.
struct ViewTable {
    /// Host offset of the table (the L1 entry it came from).
    offset: u64,
    /// The file's size when the snapshot was taken: its entries are
    /// checked against it.
    file_size: u64,
    table: Snapshot<Vec<u8>>,
}

/// See the module docs.
pub(crate) struct QueueView {
    image: u64,
    g: ImageGeometry,
    l1: Snapshot<Vec<u64>>,
    tables: HashMap<usize, ViewTable>,
    capacity: usize,
    /// The backing image's own view (or whatever its format keeps).
    backing: PlanCache,
}

/// What a lookup found for a guest offset.
enum Found {
    /// No L2 table maps it.
    Unmapped,
    /// The raw L2 entry, its subcluster bitmap, and the file-size bound.
    Entry {
        raw: u64,
        bitmap: u64,
        file_size: u64,
    },
}

impl QueueView {
    fn new(image: u64, st: &State) -> Self {
        QueueView {
            image,
            g: st.meta.geometry().clone(),
            l1: st.meta.l1_snapshot(),
            tables: HashMap::new(),
            capacity: st.meta.l2_cache_capacity(),
            backing: PlanCache::default(),
        }
    }

    /// The entry for `guest` from the snapshots alone; `None` when they
    /// cannot answer (see the module docs).
    fn lookup(&self, guest: u64) -> Option<Found> {
        let l1 = self.l1.current()?;
        let cluster = guest >> self.g.cluster_bits;
        let i1 = (cluster / self.g.l2_entries) as usize;
        let i2 = (cluster % self.g.l2_entries) as usize;
        let Some(&raw1) = l1.get(i1) else {
            return Some(Found::Unmapped);
        };
        // A bad entry is reported by the locked path.
        let (offset, _) = match decode_l1(raw1, self.g.cluster_size).ok()? {
            None => return Some(Found::Unmapped),
            Some(t) => t,
        };
        let t = self.tables.get(&i1).filter(|t| t.offset == offset)?;
        let table = t.table.current()?;
        let (raw, bitmap) = raw_entry(&self.g, table, i2);
        Some(Found::Entry {
            raw,
            bitmap,
            file_size: t.file_size,
        })
    }

    /// Under the lock: fresh snapshots of the L1 table and of the L2 table
    /// covering `guest` (loaded into the image's cache if needed), then
    /// the lookup, which the lock makes sure they answer.
    fn refresh(&mut self, st: &mut State, guest: u64) -> Result<Found, BlockError> {
        let meta = &mut st.meta;
        if self.l1.current().is_none() {
            self.l1 = meta.l1_snapshot();
        }
        let (i1, _) = meta.indices(guest);
        if let Some((offset, _)) = meta.l2_table(i1)? {
            meta.load_l2(offset)?;
            let table = meta
                .l2_table_snapshot(offset)
                .ok_or_else(|| meta.invalid("L2 cache lost a table"))?;
            if self.tables.len() >= self.capacity {
                self.tables.clear();
            }
            self.tables.insert(
                i1,
                ViewTable {
                    offset,
                    file_size: meta.file_size(),
                    table,
                },
            );
        }
        self.lookup(guest)
            .ok_or_else(|| meta.invalid("a queue's table snapshot is stale under the lock"))
    }

    /// `Format::plan_read_cached` of image `image` (its id), whose tables
    /// are `state`, for a range checked against its size (see the module
    /// docs): through the view `cache` keeps for it, made (under the lock)
    /// if the cache holds none, or one of another image. Inline (with
    /// `plan`) into `Format::plan_read_cached`, for the same reason.
    #[inline]
    pub fn plan_read(
        cache: &mut PlanCache,
        image: u64,
        planner: &ReadPlanner<'_>,
        state: &Mutex<State>,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        let view = cache.get_or_insert_with(|| None::<QueueView>);
        if view.as_ref().is_none_or(|v| v.image != image) {
            *view = Some(QueueView::new(image, &lock(state)));
        }
        let Some(view) = view.as_mut() else {
            unreachable!("the view was made above");
        };
        view.plan(planner, state, offset, len, plan)
    }

    // Inline with `plan_read`, its one caller: every read of an
    // allocated cluster runs it, and which codegen unit the caller lands
    // in depends on the module tree (an out-of-line call cost about 30
    // instructions per request under callgrind).
    #[inline]
    fn plan(
        &mut self,
        planner: &ReadPlanner<'_>,
        state: &Mutex<State>,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        let end = offset + len;
        let mut pos = offset;
        // An unallocated range waiting for the backing image's plan.
        let mut backing: Option<(u64, u64)> = None;
        while pos < end {
            let found = match self.lookup(pos) {
                Some(f) => f,
                None => self.refresh(&mut lock(state), pos)?,
            };
            let (piece, n) = match found {
                Found::Unmapped => {
                    let cover = self.g.l2_coverage();
                    (None, (cover - pos % cover).min(end - pos))
                }
                Found::Entry {
                    raw,
                    bitmap,
                    file_size,
                } => {
                    let entry =
                        checked_entry(&self.g, planner.path(), file_size, pos, raw, bitmap)?;
                    planner.piece_of(&self.g, file_size, entry, pos, end)?
                }
            };
            match piece {
                Some(p) => {
                    if let Some((at, l)) = backing.take() {
                        planner.plan_backing(Some(&mut self.backing), at, l, plan)?;
                    }
                    push_piece(plan, p);
                }
                None if planner.has_backing() => {
                    backing = Some(match backing {
                        Some((at, l)) => (at, l + n),
                        None => (pos, n),
                    });
                }
                None => push_piece(
                    plan,
                    ReadPiece {
                        len: n,
                        source: ReadSource::Zero,
                    },
                ),
            }
            pos += n;
        }
        if let Some((at, l)) = backing {
            planner.plan_backing(Some(&mut self.backing), at, l, plan)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use super::*;
    use crate::formats::qcow2::tools::create::{create_qcow2, Qcow2Params};
    use crate::formats::qcow2::Qcow2Image;
    use crate::formats::{FileId, Format, WriteOutcome};
    use crate::options::DiskOptions;
    use crate::prealloc::Preallocation;

    const CLUSTER: u64 = 64 << 10;

    /// An 8 MiB image with 64 KiB clusters, opened read-write.
    fn image(tag: &str, preallocation: Preallocation) -> (PathBuf, Arc<Qcow2Image>) {
        let path = std::env::temp_dir().join(format!("queue-view-{tag}-{}", std::process::id()));
        create_qcow2(
            &path,
            &Qcow2Params {
                size: 8 << 20,
                cluster_bits: 16,
                version: 3,
                refcount_order: 4,
                lazy_refcounts: false,
                extended_l2: false,
                zstd: false,
                backing_file: None,
                backing_format: None,
                preallocation,
                sources: Vec::new(),
            },
        )
        .unwrap();
        let opts = DiskOptions::new(&path);
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (
            path,
            Arc::new(
                crate::formats::qcow2::open_qcow2(&opts, file, &crate::formats::FORMATS).unwrap(),
            ),
        )
    }

    fn plan(img: &Qcow2Image, cache: &mut PlanCache, offset: u64, len: u64) -> ReadPlan {
        let mut p = ReadPlan::new();
        img.plan_read_cached(cache, offset, len, &mut p).unwrap();
        p
    }

    fn is_host(p: &ReadPlan) -> bool {
        p.iter().all(|x| {
            matches!(
                x.source,
                ReadSource::Host {
                    file: FileId(0),
                    ..
                }
            )
        })
    }

    #[test]
    fn allocated_clusters_are_planned_while_another_thread_holds_the_image_lock() {
        let (path, img) = image("lockfree", Preallocation::Metadata);
        let mut cache = PlanCache::default();
        // The first plan takes the snapshots (under the lock).
        assert!(is_host(&plan(&img, &mut cache, 0, 4096)));
        let held = img.lock();
        let (tx, rx) = mpsc::channel();
        let reader = Arc::clone(&img);
        let t = std::thread::spawn(move || {
            let p = plan(&reader, &mut cache, 3 * CLUSTER + 512, 2 * CLUSTER);
            tx.send(p).unwrap();
        });
        let p = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the read plan waited for the image lock");
        drop(held);
        t.join().unwrap();
        assert!(is_host(&p), "{p:?}");
        assert_eq!(p.iter().map(|x| x.len).sum::<u64>(), 2 * CLUSTER);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn mappings_changed_after_the_snapshot_are_seen() {
        let (path, img) = image("stale", Preallocation::Off);
        let waker = Arc::new(vmm_sys_util::eventfd::EventFd::new(0).unwrap());
        let mut cache = PlanCache::default();
        let zero = |p: &ReadPlan| p.iter().all(|x| x.source == ReadSource::Zero);
        assert!(zero(&plan(&img, &mut cache, CLUSTER, 4096)));
        // Another "queue" allocates the cluster: the first L2 table and the
        // L1 entry change under the view's snapshots.
        let WriteOutcome::Ready(w) = img.plan_write(CLUSTER, 4096, &waker).unwrap() else {
            panic!("blocked");
        };
        img.commit(w.commit.unwrap()).unwrap();
        assert!(is_host(&plan(&img, &mut cache, CLUSTER, 4096)));
        // A second allocation in the same table, now held by the view.
        let WriteOutcome::Ready(w) = img.plan_write(2 * CLUSTER, 4096, &waker).unwrap() else {
            panic!("blocked");
        };
        img.commit(w.commit.unwrap()).unwrap();
        assert!(is_host(&plan(&img, &mut cache, 2 * CLUSTER, 4096)));
        // A discard unmaps the first again.
        let WriteOutcome::Ready(d) = img.plan_discard(CLUSTER, CLUSTER, &waker).unwrap() else {
            panic!("blocked");
        };
        if let Some(c) = d.commit {
            img.commit(c).unwrap();
        }
        assert!(zero(&plan(&img, &mut cache, CLUSTER, 4096)));
        assert!(is_host(&plan(&img, &mut cache, 2 * CLUSTER, 4096)));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_view_is_bound_to_its_image() {
        let (p1, a) = image("bind-a", Preallocation::Metadata);
        let (p2, b) = image("bind-b", Preallocation::Off);
        let mut cache = PlanCache::default();
        assert!(is_host(&plan(&a, &mut cache, 0, 4096)));
        // The same cache handed to another image: its own tables answer.
        let p = plan(&b, &mut cache, 0, 4096);
        assert!(p.iter().all(|x| x.source == ReadSource::Zero), "{p:?}");
        std::fs::remove_file(p1).unwrap();
        std::fs::remove_file(p2).unwrap();
    }
}
