//! A small, read-only reader of ext4 metadata: which blocks of a volume hold
//! the files under a directory — what a directory class needs
//! (docs/caching.md).
//!
//! It reads the file system through a caller's read function (a volume, an
//! image file), never writes, and trusts nothing: every offset is bounds-
//! checked against the file system's size and every loop is bounded, so a
//! corrupt or hostile image yields an error, not a hang or a panic.
//!
//! Supported: ext4 (and ext2/3 images with the `extents` feature on the
//! files that matter) with 1-64 KiB blocks, 32- or 64-bit group descriptors,
//! extent-mapped files and directories (the ext4 default), linear and
//! hashed (htree) directories (both are read block by block as linear
//! entries: htree index blocks look like one empty entry), inline data
//! (no blocks to report), and the jbd2 journal of a mounted file system
//! (see below). Not supported, with a typed error: files mapped by the old
//! indirect block maps (ext2/3 without extents); matched as bytes:
//! encrypted or case-folded names.
//!
//! **The journal.** ext4 writes a transaction's metadata to its journal at
//! each commit (every 5 s by default) and in place only at a checkpoint,
//! often much later. A block server reading a mounted file system sees the
//! in-place copies, so a new file would stay unknown for as long as that.
//! The reader therefore replays the journal in memory, read-only, as the
//! kernel's recovery does: from the journal superblock's first transaction,
//! every committed transaction in sequence order (descriptor tags with their
//! escape and 32/64-bit and checksum-v2/v3 layouts, revoke records), the
//! newest copy of each block overlaid on what the disk holds. A transaction
//! without its commit block is ignored. Checksums are not verified: a stale
//! or torn overlay can only misclassify a block, never change data.
//! Fast-commit blocks are not read (files recorded only there are found at
//! the next full commit). ext4 writes a file's data before the commit that
//! names it, so a new file's first blocks are found only after that commit.

use std::collections::HashSet;

/// What a caller's read function fails with: its own error, kept as the
/// cause (`Ext4Error::Io`), e.g. a `VolumeError` or an `std::io::Error`.
pub type ReadError = Box<dyn std::error::Error + Send + Sync>;

/// Errors reading ext4 metadata.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Ext4Error {
    #[error("reading the file system: {0}")]
    Io(#[source] ReadError),
    #[error("reading the file system: {len} bytes at byte {offset} came back as {got}")]
    ShortRead { offset: u64, len: usize, got: usize },
    #[error("byte {end} is past the device's end ({size} bytes)")]
    PastEnd { end: u64, size: u64 },
    #[error("not an ext4 file system (no superblock magic)")]
    NotExt4,
    #[error("unsupported ext4 feature: {0}")]
    Unsupported(&'static str),
    #[error("corrupt ext4 metadata: {0}")]
    Corrupt(&'static str),
    #[error("no such directory: {0}")]
    NotFound(String),
}

const ROOT_INODE: u32 = 2;
const EXTENTS_FL: u32 = 0x8_0000;
const INLINE_DATA_FL: u32 = 0x1000_0000;
const INCOMPAT_64BIT: u32 = 0x80;
const INCOMPAT_META_BG: u32 = 0x10;
/// A group descriptor's flag: the group's block bitmap was never written
/// (no block of the group is in use but its own metadata).
const BG_BLOCK_UNINIT: u16 = 0x2;
const EXTENT_MAGIC: u16 = 0xF30A;
const JBD2_MAGIC: u32 = 0xC03B_3998;
const COMPAT_HAS_JOURNAL: u32 = 0x4;
/// Most directory entries, extents, inodes and metadata blocks one walk
/// visits (a corrupt file system cannot make it read without end).
const ITEMS_MAX: usize = 1 << 22;

/// An ext4 file system, read through `read(byte offset, length)`.
pub struct Ext4<R: Fn(u64, usize) -> Result<Vec<u8>, ReadError>> {
    read: R,
    block: u64,
    /// The file system's size in bytes.
    bytes: u64,
    inodes_per_group: u32,
    inode_size: u64,
    desc_size: u64,
    first_data_block: u64,
    groups: u64,
    blocks_per_group: u64,
    /// The newest committed journal copy of each file-system block.
    overlay: std::collections::HashMap<u64, Vec<u8>>,
}

/// A file's or directory's inode, as far as the walk needs it.
struct Inode {
    mode: u16,
    flags: u32,
    i_block: [u8; 60],
}

impl<R: Fn(u64, usize) -> Result<Vec<u8>, ReadError>> Ext4<R> {
    /// Read and check the superblock.
    pub fn open(read: R) -> Result<Ext4<R>, Ext4Error> {
        let sb = read(1024, 1024).map_err(Ext4Error::Io)?;
        if sb.len() < 1024 || u16_at(&sb, 0x38) != 0xEF53 {
            return Err(Ext4Error::NotExt4);
        }
        let log = u32_at(&sb, 0x18);
        if log > 6 {
            return Err(Ext4Error::Corrupt("block size"));
        }
        let block = 1024u64 << log;
        let incompat = u32_at(&sb, 0x60);
        let wide = incompat & INCOMPAT_64BIT != 0;
        if incompat & INCOMPAT_META_BG != 0 {
            return Err(Ext4Error::Unsupported("meta_bg group descriptors"));
        }
        let blocks = u32_at(&sb, 0x04) as u64 | if wide { (u32_at(&sb, 0x150) as u64) << 32 } else { 0 };
        let bytes = blocks.checked_mul(block).ok_or(Ext4Error::Corrupt("block count"))?;
        let blocks_per_group = u32_at(&sb, 0x20) as u64;
        let inodes_per_group = u32_at(&sb, 0x28);
        let rev = u32_at(&sb, 0x4C);
        let inode_size = if rev == 0 { 128 } else { u16_at(&sb, 0x58) as u64 };
        let desc_size = if wide { (u16_at(&sb, 0xFE) as u64).max(32) } else { 32 };
        let first_data_block = u32_at(&sb, 0x14) as u64;
        if blocks_per_group == 0 || inodes_per_group == 0 || !(128..=4096).contains(&inode_size) || desc_size > 1024 {
            return Err(Ext4Error::Corrupt("superblock geometry"));
        }
        let groups = blocks.saturating_sub(first_data_block).div_ceil(blocks_per_group);
        let journal_inode = (u32_at(&sb, 0x5C) & COMPAT_HAS_JOURNAL != 0).then(|| u32_at(&sb, 0xE0));
        let overlay = Default::default();
        let mut fs = Ext4 {
            read,
            block,
            bytes,
            inodes_per_group,
            inode_size,
            desc_size,
            first_data_block,
            groups,
            blocks_per_group,
            overlay,
        };
        if let Some(n) = journal_inode.filter(|&n| n != 0) {
            fs.overlay = fs.replay_journal(n)?;
        }
        Ok(fs)
    }

    /// File-system blocks the journal holds newer committed copies of.
    pub fn journal_blocks(&self) -> usize {
        self.overlay.len()
    }

    /// Replay the journal of inode `n` in memory (module doc): the newest
    /// committed copy of each block it holds.
    fn replay_journal(&self, n: u32) -> Result<std::collections::HashMap<u64, Vec<u8>>, Ext4Error> {
        let mut overlay = std::collections::HashMap::new();
        let ino = self.inode(n)?;
        let mut budget = ITEMS_MAX;
        let map: Vec<(u64, u64)> = self.extents(&ino, &mut budget)?;
        let journal_len: u64 = map.iter().map(|e| e.1).sum();
        // Journal block j: the j-th block of the journal inode's extents.
        let block_of = |mut j: u64| -> Result<Vec<u8>, Ext4Error> {
            for &(start, len) in &map {
                if j < len {
                    return self.read_raw((start + j) * self.block, self.block as usize);
                }
                j -= len;
            }
            Err(Ext4Error::Corrupt("a journal block past the journal's end"))
        };
        let jsb = block_of(0)?;
        let be = |b: &[u8], o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        if be(&jsb, 0) != JBD2_MAGIC || !matches!(be(&jsb, 4), 3 | 4) {
            return Err(Ext4Error::Corrupt("journal superblock"));
        }
        let (maxlen, first, mut seq, start) =
            (be(&jsb, 0x10) as u64, be(&jsb, 0x14) as u64, be(&jsb, 0x18), be(&jsb, 0x1C) as u64);
        if be(&jsb, 0x0C) as u64 != self.block || maxlen > journal_len || first == 0 || first >= maxlen {
            return Err(Ext4Error::Corrupt("journal geometry"));
        }
        if start == 0 {
            return Ok(overlay); // clean: nothing to replay
        }
        let incompat = if be(&jsb, 4) == 4 { be(&jsb, 0x28) } else { 0 };
        let (wide, csum2, csum3) = (incompat & 0x2 != 0, incompat & 0x8 != 0, incompat & 0x10 != 0);
        let tag_bytes = if csum3 { 16 } else { 8 + if csum2 { 2 } else { 0 } + if wide { 4 } else { 0 } };
        let tail = if csum2 || csum3 { 4 } else { 0 };
        let next = |p: u64| if p + 1 >= maxlen { first } else { p + 1 };
        let mut pos = start;
        // The transaction being read: (fs block, journal block, escaped), revoked blocks.
        let mut tags: Vec<(u64, u64, bool)> = Vec::new();
        let mut revoked: HashSet<u64> = HashSet::new();
        for _ in 0..maxlen {
            let b = block_of(pos)?;
            if be(&b, 0) != JBD2_MAGIC || be(&b, 8) != seq {
                break; // the end of the log
            }
            match be(&b, 4) {
                1 => {
                    let mut at = 12;
                    let mut data = next(pos);
                    while at + tag_bytes <= b.len() - tail {
                        let low = be(&b, at) as u64;
                        let flags =
                            if csum3 { be(&b, at + 4) } else { u16::from_be_bytes([b[at + 6], b[at + 7]]) as u32 };
                        let high = if wide { be(&b, at + 8) as u64 } else { 0 };
                        tags.push((high << 32 | low, data, flags & 1 != 0));
                        data = next(data);
                        at += tag_bytes + if flags & 2 == 0 { 16 } else { 0 };
                        if flags & 8 != 0 {
                            break;
                        }
                    }
                    pos = data;
                    continue;
                }
                2 => {
                    for &r in &revoked {
                        overlay.remove(&r);
                    }
                    for &(fs_block, j, escaped) in &tags {
                        if revoked.contains(&fs_block)
                            || (fs_block + 1).checked_mul(self.block).is_none_or(|e| e > self.bytes)
                        {
                            continue;
                        }
                        let mut copy = block_of(j)?;
                        if escaped {
                            copy[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                        }
                        overlay.insert(fs_block, copy);
                    }
                    tags.clear();
                    revoked.clear();
                    seq = seq.wrapping_add(1);
                }
                5 => {
                    let count = (be(&b, 12) as usize).min(b.len() - tail);
                    let step = if wide { 8 } else { 4 };
                    let mut at = 16;
                    while at + step <= count {
                        let r =
                            if wide { (be(&b, at) as u64) << 32 | be(&b, at + 4) as u64 } else { be(&b, at) as u64 };
                        revoked.insert(r);
                        at += step;
                    }
                }
                _ => {}
            }
            pos = next(pos);
        }
        Ok(overlay)
    }

    /// The file system's block size.
    pub fn block_bytes(&self) -> u64 {
        self.block
    }

    /// How the file system divides the device into block groups: what its
    /// allocator places near each other (`Geometry`).
    pub fn geometry(&self) -> Geometry {
        Geometry {
            first_byte: self.first_data_block * self.block,
            group_bytes: self.blocks_per_group * self.block,
            groups: self.groups,
        }
    }

    /// The byte ranges (sorted, merged) of the blocks the file system holds
    /// in use, by its block bitmaps as the journal has them: every file's
    /// and directory's data, the journal, the superblock and descriptor
    /// copies — all but the groups' bitmaps and inode tables, which hold no
    /// file's data and would weigh a group by its metadata. A group whose
    /// bitmap was never written (`BLOCK_UNINIT`) holds nothing of files and
    /// is left out.
    pub fn allocated(&self) -> Result<Vec<(u64, u64)>, Ext4Error> {
        let gdt = (self.first_data_block + 1) * self.block;
        let mut maps: Vec<(u64, u64)> = Vec::new(); // (bitmap block, group)
        let mut fixed: Vec<(u64, u64)> = Vec::new(); // bitmaps and inode tables, bytes
        let table_blocks = (self.inodes_per_group as u64 * self.inode_size).div_ceil(self.block);
        for g in 0..self.groups {
            let d = self.read(gdt + g * self.desc_size, self.desc_size as usize)?;
            let at = |lo: usize| {
                let mut b = u32_at(&d, lo) as u64;
                if self.desc_size >= 64 {
                    b |= (u32_at(&d, lo + 0x20) as u64) << 32;
                }
                b.saturating_mul(self.block)
            };
            let (bitmap, inodes, table) = (at(0x00), at(0x04), at(0x08));
            fixed.extend([
                (bitmap, bitmap.saturating_add(self.block)),
                (inodes, inodes.saturating_add(self.block)),
                (table, table.saturating_add(table_blocks * self.block)),
            ]);
            if u16_at(&d, 0x12) & BG_BLOCK_UNINIT != 0 {
                continue;
            }
            maps.push((bitmap / self.block, g));
        }
        maps.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        let per_group = self.blocks_per_group.min(self.block * 8);
        let mut i = 0;
        while i < maps.len() {
            // Bitmaps of a flex group lie side by side: one read for a run.
            let mut n = 1;
            while i + n < maps.len() && maps[i + n].0 == maps[i].0 + n as u64 && n < 256 {
                n += 1;
            }
            let bytes = self.read(
                maps[i].0.checked_mul(self.block).ok_or(Ext4Error::Corrupt("block bitmap"))?,
                (n as u64 * self.block) as usize,
            )?;
            for (k, &(_, g)) in maps[i..i + n].iter().enumerate() {
                let bits = &bytes[k * self.block as usize..][..self.block as usize];
                let first = self.first_data_block + g * self.blocks_per_group;
                let count = per_group.min((self.bytes / self.block).saturating_sub(first));
                let mut b = 0;
                while b < count {
                    if bits[(b / 8) as usize] & (1 << (b % 8)) == 0 {
                        b += 1;
                        continue;
                    }
                    let start = b;
                    while b < count && bits[(b / 8) as usize] & (1 << (b % 8)) != 0 {
                        b += 1;
                    }
                    out.push(((first + start) * self.block, (first + b) * self.block));
                }
            }
            i += n;
        }
        out.sort_unstable();
        fixed.sort_unstable();
        Ok(without(&merged(out), &merged(fixed)))
    }

    /// `read_raw`, with the journal's newer copies of the blocks overlaid.
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, Ext4Error> {
        let mut b = self.read_raw(offset, len)?;
        if !self.overlay.is_empty() {
            let end = offset + len as u64;
            for blk in offset / self.block..end.div_ceil(self.block) {
                if let Some(copy) = self.overlay.get(&blk) {
                    let (a, z) = ((blk * self.block).max(offset), ((blk + 1) * self.block).min(end));
                    let from = (a - blk * self.block) as usize;
                    b[(a - offset) as usize..(z - offset) as usize]
                        .copy_from_slice(&copy[from..from + (z - a) as usize]);
                }
            }
        }
        Ok(b)
    }

    /// Read what the disk holds, bounds-checked.
    fn read_raw(&self, offset: u64, len: usize) -> Result<Vec<u8>, Ext4Error> {
        if offset.checked_add(len as u64).is_none_or(|end| end > self.bytes) {
            return Err(Ext4Error::Corrupt("a pointer past the end of the file system"));
        }
        let b = (self.read)(offset, len).map_err(Ext4Error::Io)?;
        if b.len() != len {
            return Err(Ext4Error::ShortRead { offset, len, got: b.len() });
        }
        Ok(b)
    }

    fn inode(&self, n: u32) -> Result<Inode, Ext4Error> {
        if n == 0 || (n - 1) as u64 / self.inodes_per_group as u64 >= self.groups {
            return Err(Ext4Error::Corrupt("inode number"));
        }
        let group = (n - 1) as u64 / self.inodes_per_group as u64;
        let index = (n - 1) as u64 % self.inodes_per_group as u64;
        let gdt = (self.first_data_block + 1) * self.block;
        let d = self.read(gdt + group * self.desc_size, self.desc_size as usize)?;
        let mut table = u32_at(&d, 0x08) as u64;
        if self.desc_size >= 64 {
            table |= (u32_at(&d, 0x28) as u64) << 32;
        }
        let at = (table.checked_mul(self.block)).and_then(|t| t.checked_add(index * self.inode_size));
        let raw = self.read(at.ok_or(Ext4Error::Corrupt("inode table"))?, 128)?;
        let mut i_block = [0u8; 60];
        i_block.copy_from_slice(&raw[0x28..0x28 + 60]);
        Ok(Inode { mode: u16_at(&raw, 0), flags: u32_at(&raw, 0x20), i_block })
    }

    /// The extents of inode `ino`'s data: (first file-system block, blocks).
    fn extents(&self, ino: &Inode, budget: &mut usize) -> Result<Vec<(u64, u64)>, Ext4Error> {
        if ino.flags & INLINE_DATA_FL != 0 {
            return Ok(Vec::new());
        }
        if ino.flags & EXTENTS_FL == 0 {
            return Err(Ext4Error::Unsupported("files mapped by indirect blocks (ext2/3 without extents)"));
        }
        let mut out = Vec::new();
        self.walk_node(&ino.i_block, 0, &mut out, budget, &mut HashSet::new())?;
        Ok(out)
    }

    fn walk_node(
        &self,
        node: &[u8],
        level: u32,
        out: &mut Vec<(u64, u64)>,
        budget: &mut usize,
        seen: &mut HashSet<u64>,
    ) -> Result<(), Ext4Error> {
        if node.len() < 12 || u16_at(node, 0) != EXTENT_MAGIC {
            return Err(Ext4Error::Corrupt("extent header"));
        }
        let entries = u16_at(node, 2) as usize;
        let depth = u16_at(node, 6);
        if level > 5 || depth > 5 || 12 + entries * 12 > node.len() {
            return Err(Ext4Error::Corrupt("extent tree shape"));
        }
        for e in 0..entries {
            *budget = budget.checked_sub(1).ok_or(Ext4Error::Corrupt("too many extents"))?;
            let x = &node[12 + e * 12..24 + e * 12];
            if depth == 0 {
                let len = u16_at(x, 4) as u64;
                // Past 32768: an unwritten (preallocated) extent, still allocated.
                let len = if len > 32768 { len - 32768 } else { len };
                let start = (u16_at(x, 6) as u64) << 32 | u32_at(x, 8) as u64;
                if (start + len).checked_mul(self.block).is_none_or(|end| end > self.bytes) {
                    return Err(Ext4Error::Corrupt("extent past the end"));
                }
                out.push((start, len));
            } else {
                let leaf = (u16_at(x, 8) as u64) << 32 | u32_at(x, 4) as u64;
                if !seen.insert(leaf) {
                    return Err(Ext4Error::Corrupt("an extent index block named twice"));
                }
                let at = leaf.checked_mul(self.block).ok_or(Ext4Error::Corrupt("extent index block"))?;
                let child = self.read(at, self.block as usize)?;
                self.walk_node(&child, level + 1, out, budget, seen)?;
            }
        }
        Ok(())
    }

    /// The entries of directory `ino`: (name, inode, file type).
    fn entries(&self, ino: &Inode, budget: &mut usize) -> Result<Vec<(Vec<u8>, u32, u8)>, Ext4Error> {
        let mut out = Vec::new();
        for (start, len) in self.extents(ino, budget)? {
            for b in start..start + len {
                *budget = budget.checked_sub(1).ok_or(Ext4Error::Corrupt("too many directory blocks"))?;
                let data = self.read(b * self.block, self.block as usize)?;
                let mut at = 0usize;
                while at + 8 <= data.len() {
                    let inode = u32_at(&data, at);
                    let rec_len = u16_at(&data, at + 4) as usize;
                    let name_len = data[at + 6] as usize;
                    if rec_len < 8 || at + rec_len > data.len() || 8 + name_len > rec_len {
                        break;
                    }
                    if inode != 0 {
                        *budget = budget.checked_sub(1).ok_or(Ext4Error::Corrupt("too many directory entries"))?;
                        out.push((data[at + 8..at + 8 + name_len].to_vec(), inode, data[at + 7]));
                    }
                    at += rec_len;
                }
            }
        }
        Ok(out)
    }

    /// The inode of `path` (absolute, `/`-separated), which must be a directory.
    fn lookup(&self, path: &str, budget: &mut usize) -> Result<u32, Ext4Error> {
        let mut n = ROOT_INODE;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let dir = self.inode(n)?;
            n = (self.entries(&dir, budget)?.into_iter())
                .find(|(name, _, _)| name == part.as_bytes())
                .map(|(_, ino, _)| ino)
                .ok_or_else(|| Ext4Error::NotFound(path.to_string()))?;
        }
        if self.inode(n)?.mode & 0xF000 != 0x4000 {
            return Err(Ext4Error::NotFound(format!("{path} (not a directory)")));
        }
        Ok(n)
    }

    /// The byte ranges of the file system (sorted, merged) holding the data
    /// of every file under directory `path` and the directories themselves,
    /// recursively. Hard links and loops are followed once.
    pub fn directory_extents(&self, path: &str) -> Result<Vec<(u64, u64)>, Ext4Error> {
        let mut budget = ITEMS_MAX;
        let top = self.lookup(path, &mut budget)?;
        let mut seen = HashSet::new();
        let mut todo = vec![top];
        let mut blocks: Vec<(u64, u64)> = Vec::new();
        while let Some(n) = todo.pop() {
            if !seen.insert(n) {
                continue;
            }
            let ino = self.inode(n)?;
            blocks.extend(self.extents(&ino, &mut budget)?);
            if ino.mode & 0xF000 != 0x4000 {
                continue;
            }
            for (name, child, kind) in self.entries(&ino, &mut budget)? {
                if name == b"." || name == b".." {
                    continue;
                }
                // 1 regular file, 2 directory; 0 (no file type feature): look.
                let is_data = match kind {
                    1 | 2 => true,
                    0 => matches!(self.inode(child)?.mode & 0xF000, 0x8000 | 0x4000),
                    _ => false,
                };
                if is_data {
                    todo.push(child);
                }
            }
        }
        let mut out: Vec<(u64, u64)> = blocks.iter().map(|&(s, n)| (s * self.block, (s + n) * self.block)).collect();
        out.sort_unstable();
        Ok(merged(out))
    }

    /// What a directory class needs of the file system at one moment: the
    /// directory's files (`directory_extents`), every block in use
    /// (`allocated`) and the group geometry — from which a block server
    /// predicts the class of a block written before the metadata naming its
    /// file is committed (the engine's `predict` module).
    pub fn directory_layout(&self, path: &str) -> Result<Layout, Ext4Error> {
        Ok(Layout { class: self.directory_extents(path)?, allocated: self.allocated()?, geometry: self.geometry() })
    }
}

/// Sorted, disjoint ranges `a` less sorted, disjoint ranges `b`.
fn without(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(a.len());
    let mut j = 0;
    for &(mut s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            if b[k].0 > s {
                out.push((s, b[k].0));
            }
            s = s.max(b[k].1);
            k += 1;
        }
        if s < e {
            out.push((s, e));
        }
    }
    out
}

/// Sorted byte ranges with touching or overlapping ones joined.
fn merged(sorted: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (a, b) in sorted {
        match out.last_mut() {
            Some(last) if last.1 >= a => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// How an ext4 file system divides its device (`Ext4::geometry`). ext4's
/// allocator places a file's data in or after its inode's group — with
/// `flex_bg`, from the second group of the inode's flexible group on — and
/// a directory's inodes near its parent's, so files of one directory tree
/// tend to share groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Byte where group 0 starts.
    pub first_byte: u64,
    pub group_bytes: u64,
    pub groups: u64,
}

/// A directory's files, the blocks in use and the geometry, read at one
/// moment (`Ext4::directory_layout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Byte ranges (sorted, merged) of the directory's files.
    pub class: Vec<(u64, u64)>,
    /// Byte ranges (sorted, merged) of every block in use.
    pub allocated: Vec<(u64, u64)>,
    pub geometry: Geometry,
}

/// The byte ranges of `volume` holding the files under directory `path` of
/// the ext4 file system on it (reads are widened to the volume's blocks).
pub fn volume_directory_extents(volume: &dyn sluice_volume::Volume, path: &str) -> Result<Vec<(u64, u64)>, Ext4Error> {
    let read = |offset: u64, buf: &mut [u8]| volume.read(offset, buf).map_err(ReadError::from);
    directory_extents_via(volume.size_bytes(), volume.block_bytes(), read, path)
}

/// `volume_directory_extents` through `read(offset, buf)` of a device of
/// `size` bytes and `bs`-byte blocks (offsets and lengths whole blocks).
pub fn directory_extents_via(
    size: u64,
    bs: u64,
    read_blocks: impl Fn(u64, &mut [u8]) -> Result<(), ReadError>,
    path: &str,
) -> Result<Vec<(u64, u64)>, Ext4Error> {
    Ext4::open(block_reader(size, bs, read_blocks))?.directory_extents(path)
}

/// `directory_extents_via`, with every block in use and the geometry
/// (`Ext4::directory_layout`).
pub fn directory_layout_via(
    size: u64,
    bs: u64,
    read_blocks: impl Fn(u64, &mut [u8]) -> Result<(), ReadError>,
    path: &str,
) -> Result<Layout, Ext4Error> {
    Ext4::open(block_reader(size, bs, read_blocks))?.directory_layout(path)
}

/// A byte reader over whole-block reads of a device of `size` bytes.
fn block_reader(
    size: u64,
    bs: u64,
    read_blocks: impl Fn(u64, &mut [u8]) -> Result<(), ReadError>,
) -> impl Fn(u64, usize) -> Result<Vec<u8>, ReadError> {
    move |offset: u64, len: usize| -> Result<Vec<u8>, ReadError> {
        let start = offset / bs * bs;
        let end = (offset + len as u64).div_ceil(bs) * bs;
        if end > size {
            return Err(Box::new(Ext4Error::PastEnd { end, size }));
        }
        let mut b = vec![0u8; (end - start) as usize];
        read_blocks(start, &mut b)?;
        let at = (offset - start) as usize;
        Ok(b[at..at + len].to_vec())
    }
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// An image made by `mkfs.ext4 -d` from a tree of files: the extents
    /// found for a directory hold exactly its files' bytes (each file's
    /// content is found in them), another directory's files are not in
    /// them, and bad input is refused with typed errors.
    #[test]
    fn the_blocks_of_a_directory_hold_its_files_and_no_others() {
        let dir = std::env::temp_dir().join(format!("sluice-ext4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = dir.join("src");
        let mut rng = sluice_media::rng::SplitMix64(11);
        let mut content = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.next_u64() as u8).collect() };
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for (path, len) in [
            ("yarn/local/spill0", 300_000),
            ("yarn/local/sub/spill1", 40_000),
            ("yarn/local/sub/deeper/spill2", 1_000_000),
            ("hdfs/blk_1", 2_000_000),
            ("hdfs/blk_2", 65_536),
        ] {
            let p = src.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let c = content(len);
            std::fs::write(&p, &c).unwrap();
            files.push((path.into(), c));
        }
        // Many entries: a hashed (htree) directory.
        for i in 0..300 {
            let p = src.join(format!("yarn/local/many/f{i:04}"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let c = content(5000);
            std::fs::write(&p, &c).unwrap();
            files.push((format!("yarn/local/many/f{i:04}"), c));
        }
        let img = dir.join("fs.img");
        let out = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-d"])
            .arg(&src)
            .arg(&img)
            .arg("64M")
            .output()
            .expect("mkfs.ext4 (e2fsprogs) is installed by scripts/setup.sh");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let image = std::fs::read(&img).unwrap();
        let read = |o: u64, n: usize| -> Result<Vec<u8>, ReadError> {
            image.get(o as usize..o as usize + n).map(|s| s.to_vec()).ok_or_else(|| "past the image".into())
        };
        let fs = Ext4::open(read).unwrap();
        assert_eq!(fs.block_bytes(), 4096);
        let yarn = fs.directory_extents("/yarn/local").unwrap();
        let hdfs = fs.directory_extents("hdfs").unwrap();
        let inside = |ranges: &[(u64, u64)], data: &[u8]| -> bool {
            // Every 4 KiB piece of the file is found at a block inside the ranges.
            data.chunks(4096).all(|piece| {
                ranges
                    .iter()
                    .any(|&(a, b)| (a..b).step_by(4096).any(|o| image[o as usize..o as usize + piece.len()] == *piece))
            })
        };
        for (path, c) in &files {
            let (mine, other) = if path.starts_with("yarn") { (&yarn, &hdfs) } else { (&hdfs, &yarn) };
            assert!(inside(mine, c), "{path} is in its directory's blocks");
            if c.len() > 4096 {
                assert!(!inside(other, &c[..4096]), "{path} is not in the other directory's blocks");
            }
        }
        let bytes: u64 = yarn.iter().map(|(a, b)| b - a).sum();
        assert!((1_340_000 + 300 * 4096..4 << 20).contains(&bytes), "{bytes}");
        // Every block of every file is in use by the bitmaps; most of the
        // image is free; the geometry is mkfs's for 64 MiB.
        let used = fs.allocated().unwrap();
        let within = |o: u64| used.iter().any(|&(a, b)| (a..b).contains(&o));
        for &(a, b) in yarn.iter().chain(&hdfs) {
            assert!((a..b).step_by(4096).all(within), "{a}..{b} is in use");
        }
        assert!(within(0), "the superblock's group metadata is in use");
        let used_bytes: u64 = used.iter().map(|(a, b)| b - a).sum();
        assert!(used_bytes < 40 << 20 && used_bytes > bytes, "{used_bytes}");
        assert!(used.windows(2).all(|w| w[0].1 < w[1].0), "sorted and merged");
        assert_eq!(
            without(&[(0, 100), (200, 300)], &[(50, 60), (90, 210), (250, 400)]),
            [(0, 50), (60, 90), (210, 250)]
        );
        let g = fs.geometry();
        assert_eq!((g.first_byte, g.group_bytes, g.groups), (0, 128 << 20, 1));
        assert_eq!(fs.directory_layout("/yarn/local").unwrap().class, yarn);
        // Typed refusals.
        assert!(matches!(fs.directory_extents("/nope"), Err(Ext4Error::NotFound(_))));
        assert!(matches!(fs.directory_extents("/hdfs/blk_1"), Err(Ext4Error::NotFound(_))));
        let zeros = |_o: u64, n: usize| -> Result<Vec<u8>, ReadError> { Ok(vec![0; n]) };
        assert!(matches!(Ext4::open(zeros), Err(Ext4Error::NotExt4)));
        // A corrupt image (every byte of the inode tables flipped) is an
        // error, never a panic or a hang.
        let mut bad = image.clone();
        for b in bad.iter_mut().skip(4096 * 2).take(4096 * 64) {
            *b = !*b;
        }
        let read_bad = |o: u64, n: usize| -> Result<Vec<u8>, ReadError> {
            bad.get(o as usize..o as usize + n).map(|s| s.to_vec()).ok_or_else(|| "past the image".into())
        };
        if let Ok(fs) = Ext4::open(read_bad) {
            let _ = fs.directory_extents("/yarn/local");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
