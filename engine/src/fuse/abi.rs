//! The FUSE wire format (linux/fuse.h, protocol 7.x): what the kernel sends
//! on `/dev/fuse` parsed into [`Request`], and the replies encoded. Pure
//! functions over byte slices; the kernel's structures are host-endian and
//! packed as the header lays them out.

use bytes::Bytes;

pub const KERNEL_MAJOR: u32 = 7;
/// The minor version this server speaks (max_pages in INIT needs 28).
pub const KERNEL_MINOR: u32 = 38;

pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;
/// The kernel refuses reads from `/dev/fuse` into smaller buffers.
pub const MIN_READ_BUFFER: usize = 8192;

// Opcodes.
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;

// INIT flags.
const ASYNC_READ: u32 = 1 << 0;
const BIG_WRITES: u32 = 1 << 5;
const ASYNC_DIO: u32 = 1 << 15;
const MAX_PAGES: u32 = 1 << 22;
const INIT_EXT: u32 = 1 << 30;
/// FUSE_OVER_IO_URING (bit 41 of the 64 flags): the kernel takes requests
/// and answers through io_uring commands on `/dev/fuse`.
const OVER_IO_URING2: u32 = 1 << (41 - 32);

// OPEN reply flags.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

const FATTR_SIZE: u32 = 1 << 3;

/// `fuse_notify_code`: drop the kernel's cached attributes of an inode.
pub const NOTIFY_INVAL_INODE: i32 = 2;

pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
/// `d_type` values of directory entries.
pub const DT_DIR: u32 = 4;
pub const DT_REG: u32 = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("request of {got} bytes is shorter than {need}")]
    Short { need: usize, got: usize },
    #[error("header says {said} bytes, {got} were read")]
    Length { said: usize, got: usize },
    #[error("name is not NUL-terminated")]
    Name,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Init {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    /// The upper 32 flag bits (protocol 7.36 on, when `flags` has INIT_EXT).
    pub flags2: u32,
}

/// What the kernel asks. Operations the server does not handle are kept as
/// their opcode and answered ENOSYS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Init(Init),
    Lookup {
        name: Vec<u8>,
    },
    Getattr,
    Setattr {
        size: Option<u64>,
    },
    Open,
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
    },
    Statfs,
    Release,
    Fsync,
    Flush,
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
    },
    Releasedir,
    /// FORGET, BATCH_FORGET and INTERRUPT: no reply is expected.
    NoReply,
    Destroy,
    Other(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub unique: u64,
    pub nodeid: u64,
    pub op: Op,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn need(body: &[u8], n: usize) -> Result<(), ParseError> {
    if body.len() < n { Err(ParseError::Short { need: IN_HEADER + n, got: IN_HEADER + body.len() }) } else { Ok(()) }
}

/// Parses one request as read from `/dev/fuse` (one read returns one
/// request). A write's payload is copied out of `buf`.
pub fn parse(buf: &[u8]) -> Result<Request, ParseError> {
    if buf.len() < IN_HEADER {
        return Err(ParseError::Short { need: IN_HEADER, got: buf.len() });
    }
    let len = u32_at(buf, 0) as usize;
    if len != buf.len() {
        return Err(ParseError::Length { said: len, got: buf.len() });
    }
    decode(&buf[..IN_HEADER], &buf[IN_HEADER..], None)
}

/// Parses one request as the kernel leaves it in an io_uring entry: the
/// `fuse_in_header` at the start of `in_out`, the operation's own header in
/// `op_in`, and the rest of its arguments (a write's data, a lookup's name)
/// in `payload` (exactly the bytes the kernel says it copied).
pub fn parse_ring(in_out: &[u8], op_in: &[u8], payload: &[u8]) -> Result<Request, ParseError> {
    if in_out.len() < IN_HEADER {
        return Err(ParseError::Short { need: IN_HEADER, got: in_out.len() });
    }
    let len = u32_at(in_out, 0) as usize;
    let op_len = len
        .checked_sub(IN_HEADER + payload.len())
        .filter(|&n| n <= op_in.len())
        .ok_or(ParseError::Length { said: len, got: IN_HEADER + op_in.len().min(len) + payload.len() })?;
    let header = &in_out[..IN_HEADER];
    if u32_at(header, 4) == WRITE {
        return decode(header, &op_in[..op_len], Some(payload));
    }
    let body: Vec<u8> = [&op_in[..op_len], payload].concat();
    decode(header, &body, None)
}

/// Decodes a request from its header and body; a write's data is `data`
/// where it came apart from the body, else the body after `fuse_write_in`.
fn decode(header: &[u8], body: &[u8], data: Option<&[u8]>) -> Result<Request, ParseError> {
    let (opcode, unique, nodeid) = (u32_at(header, 4), u64_at(header, 8), u64_at(header, 16));
    let op = match opcode {
        INIT => {
            need(body, 16)?;
            let flags = u32_at(body, 12);
            let flags2 = if flags & INIT_EXT != 0 && body.len() >= 20 { u32_at(body, 16) } else { 0 };
            Op::Init(Init {
                major: u32_at(body, 0),
                minor: u32_at(body, 4),
                max_readahead: u32_at(body, 8),
                flags,
                flags2,
            })
        }
        LOOKUP => {
            let end = body.iter().position(|&c| c == 0).ok_or(ParseError::Name)?;
            Op::Lookup { name: body[..end].to_vec() }
        }
        GETATTR => Op::Getattr,
        SETATTR => {
            need(body, 24)?;
            let valid = u32_at(body, 0);
            Op::Setattr { size: (valid & FATTR_SIZE != 0).then(|| u64_at(body, 16)) }
        }
        OPEN => Op::Open,
        READ | READDIR => {
            need(body, 24)?;
            let (offset, size) = (u64_at(body, 8), u32_at(body, 16));
            if opcode == READ { Op::Read { offset, size } } else { Op::Readdir { offset, size } }
        }
        WRITE => {
            // fuse_write_in is 40 bytes, then the data.
            need(body, 40)?;
            let (offset, size) = (u64_at(body, 8), u32_at(body, 16) as usize);
            let data = match data {
                Some(d) if d.len() == size => d,
                Some(d) => {
                    return Err(ParseError::Length { said: IN_HEADER + 40 + size, got: IN_HEADER + 40 + d.len() });
                }
                None => {
                    need(body, 40 + size)?;
                    &body[40..40 + size]
                }
            };
            Op::Write { offset, data: Bytes::copy_from_slice(data) }
        }
        STATFS => Op::Statfs,
        RELEASE => Op::Release,
        FSYNC => Op::Fsync,
        FLUSH => Op::Flush,
        OPENDIR => Op::Opendir,
        RELEASEDIR => Op::Releasedir,
        FORGET | BATCH_FORGET | INTERRUPT => Op::NoReply,
        DESTROY => Op::Destroy,
        other => Op::Other(other),
    };
    Ok(Request { unique, nodeid, op })
}

/// The INIT answer: protocol 7.`KERNEL_MINOR` or the kernel's if older, the
/// wanted flags the kernel offers, I/O of up to `max_write` bytes.
pub fn negotiate(init: &Init, max_write: u32, max_background: u16) -> Vec<u8> {
    let wanted = ASYNC_READ | BIG_WRITES | ASYNC_DIO | MAX_PAGES;
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&KERNEL_MAJOR.to_ne_bytes());
    out.extend_from_slice(&init.minor.min(KERNEL_MINOR).to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // max_readahead: no page cache
    out.extend_from_slice(&(init.flags & wanted).to_ne_bytes());
    out.extend_from_slice(&max_background.to_ne_bytes());
    out.extend_from_slice(&(max_background / 4 * 3).to_ne_bytes()); // congestion threshold
    out.extend_from_slice(&max_write.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    out.extend_from_slice(&((max_write / 4096) as u16).to_ne_bytes()); // max_pages
    out.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    out.extend_from_slice(&0u32.to_ne_bytes()); // flags2
    out.resize(64, 0); // unused
    out
}

/// Whether the kernel offers requests through io_uring (it does only when
/// the fuse module's `enable_uring` parameter is on).
pub fn offers_io_uring(init: &Init) -> bool {
    init.flags & INIT_EXT != 0 && init.flags2 & OVER_IO_URING2 != 0
}

/// Whether the kernel offers asynchronous direct I/O (many requests of one
/// file in flight at once).
pub fn offers_async_dio(init: &Init) -> bool {
    init.flags & ASYNC_DIO != 0
}

/// FUSE over io_uring (protocol 7.42): each ring entry is a header buffer
/// laid out as `fuse_uring_req_header` plus a payload buffer.
pub mod ring {
    /// `fuse_uring_req_header`: `in_out` (the in or out header), `op_in`
    /// (the operation's own header), then `fuse_uring_ent_in_out`.
    pub const HEADER: usize = 128 + 128 + 32;
    pub const IN_OUT: std::ops::Range<usize> = 0..128;
    pub const OP_IN: std::ops::Range<usize> = 128..256;
    /// `fuse_uring_ent_in_out.commit_id` and `.payload_sz`.
    pub const COMMIT_ID_AT: usize = 256 + 8;
    pub const PAYLOAD_SZ_AT: usize = 256 + 16;
    /// `cmd_op` of the io_uring command: hand the kernel an empty entry,
    /// or answer the entry's request and take the next.
    pub const CMD_REGISTER: u32 = 1;
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;

    /// `fuse_uring_cmd_req` in the command area of a 128-byte SQE.
    pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
        let mut c = [0u8; 80];
        c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        c[16..18].copy_from_slice(&qid.to_ne_bytes());
        c
    }

    /// The id the kernel gave the request now in `header`.
    pub fn commit_id(header: &[u8]) -> u64 {
        super::u64_at(header, COMMIT_ID_AT)
    }

    /// How many payload bytes the kernel wrote with the request in `header`.
    pub fn payload_size(header: &[u8]) -> usize {
        super::u32_at(header, PAYLOAD_SZ_AT) as usize
    }

    /// Writes an answer into an entry's header: the out header (its length
    /// counts the payload) and the payload size.
    pub fn set_answer(header: &mut [u8], unique: u64, error: i32, payload: usize) {
        header[..super::OUT_HEADER].copy_from_slice(&super::out_header(super::OUT_HEADER + payload, error, unique));
        header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4].copy_from_slice(&(payload as u32).to_ne_bytes());
    }
}

pub fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// A file's attributes (`fuse_attr`), all times zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub mode: u32,
    pub nlink: u32,
    pub blksize: u32,
}

fn attr_bytes(a: &Attr, out: &mut Vec<u8>) {
    for v in [a.ino, a.size, a.size / 512, 0, 0, 0] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [0u32, 0, 0, a.mode, a.nlink, 0, 0, 0, a.blksize, 0] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
}

/// `fuse_entry_out`: the entry and its attributes, both valid `ttl_secs`.
pub fn entry(a: &Attr, ttl_secs: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    for v in [a.ino, 0, ttl_secs, ttl_secs] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out.extend_from_slice(&[0u8; 8]);
    attr_bytes(a, &mut out);
    out
}

/// `fuse_attr_out`.
pub fn attr_out(a: &Attr, ttl_secs: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(104);
    out.extend_from_slice(&ttl_secs.to_ne_bytes());
    out.extend_from_slice(&[0u8; 8]);
    attr_bytes(a, &mut out);
    out
}

/// `fuse_open_out`.
pub fn open_out(fh: u64, flags: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&fh.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out
}

/// `fuse_write_out`.
pub fn write_out(size: u32) -> Vec<u8> {
    let mut out = size.to_ne_bytes().to_vec();
    out.extend_from_slice(&[0u8; 4]);
    out
}

/// `fuse_statfs_out` for a filesystem of `blocks` blocks of `bsize`, all used.
pub fn statfs_out(blocks: u64, bsize: u32, files: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(80);
    for v in [blocks, 0, 0, files, 0] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [bsize, 255, bsize, 0, 0, 0, 0, 0, 0, 0] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out
}

/// `fuse_dirent` records from `offset` on that fit in `size` bytes. Each
/// record's offset is the position after it.
pub fn dirents(entries: &[(u64, u32, &str)], offset: u64, size: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
        let record = (24 + name.len()).div_ceil(8) * 8;
        if out.len() + record > size as usize {
            break;
        }
        out.extend_from_slice(&ino.to_ne_bytes());
        out.extend_from_slice(&(i as u64 + 1).to_ne_bytes());
        out.extend_from_slice(&(name.len() as u32).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(name.as_bytes());
        out.resize(out.len() + record - 24 - name.len(), 0);
    }
    out
}

/// `FUSE_NOTIFY_INVAL_INODE` for `ino`: attributes only (offset -1).
pub fn inval_inode(ino: u64) -> Vec<u8> {
    let mut out = out_header(OUT_HEADER + 24, NOTIFY_INVAL_INODE, 0).to_vec();
    out.extend_from_slice(&ino.to_ne_bytes());
    out.extend_from_slice(&(-1i64).to_ne_bytes());
    out.extend_from_slice(&0i64.to_ne_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&((IN_HEADER + body.len()) as u32).to_ne_bytes());
        b.extend_from_slice(&opcode.to_ne_bytes());
        b.extend_from_slice(&unique.to_ne_bytes());
        b.extend_from_slice(&nodeid.to_ne_bytes());
        b.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn a_write_carries_its_offset_and_payload() {
        let mut body = vec![0u8; 40];
        body[8..16].copy_from_slice(&8192u64.to_ne_bytes());
        body[16..20].copy_from_slice(&5u32.to_ne_bytes());
        body.extend_from_slice(b"hello");
        let r = parse(&request(WRITE, 7, 2, &body)).unwrap();
        assert_eq!(
            r,
            Request { unique: 7, nodeid: 2, op: Op::Write { offset: 8192, data: Bytes::from_static(b"hello") } }
        );
    }

    #[test]
    fn a_write_shorter_than_its_size_field_is_refused() {
        let mut body = vec![0u8; 40];
        body[16..20].copy_from_slice(&4096u32.to_ne_bytes());
        body.extend_from_slice(&[1u8; 100]);
        assert!(matches!(parse(&request(WRITE, 1, 2, &body)), Err(ParseError::Short { .. })));
    }

    #[test]
    fn a_header_whose_length_disagrees_with_the_read_is_refused() {
        let mut b = request(GETATTR, 1, 1, &[0u8; 16]);
        b.push(0);
        assert_eq!(parse(&b), Err(ParseError::Length { said: 56, got: 57 }));
        assert!(matches!(parse(&b[..10]), Err(ParseError::Short { need: 40, got: 10 })));
    }

    #[test]
    fn reads_lookups_setattr_and_unknown_opcodes() {
        let mut body = vec![0u8; 40];
        body[8..16].copy_from_slice(&4096u64.to_ne_bytes());
        body[16..20].copy_from_slice(&65536u32.to_ne_bytes());
        assert_eq!(parse(&request(READ, 3, 2, &body)).unwrap().op, Op::Read { offset: 4096, size: 65536 });
        assert_eq!(parse(&request(LOOKUP, 4, 1, b"volume\0")).unwrap().op, Op::Lookup { name: b"volume".to_vec() });
        assert_eq!(parse(&request(LOOKUP, 4, 1, b"volume")), Err(ParseError::Name));
        let mut set = vec![0u8; 88];
        set[0..4].copy_from_slice(&FATTR_SIZE.to_ne_bytes());
        set[16..24].copy_from_slice(&123u64.to_ne_bytes());
        assert_eq!(parse(&request(SETATTR, 5, 2, &set)).unwrap().op, Op::Setattr { size: Some(123) });
        set[0..4].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(parse(&request(SETATTR, 5, 2, &set)).unwrap().op, Op::Setattr { size: None });
        assert_eq!(parse(&request(99, 6, 1, &[])).unwrap().op, Op::Other(99));
        assert_eq!(parse(&request(INTERRUPT, 6, 0, &[0u8; 8])).unwrap().op, Op::NoReply);
    }

    #[test]
    fn init_takes_only_offered_flags_and_the_lower_minor() {
        let init =
            Init { major: 7, minor: 45, max_readahead: 131072, flags: ASYNC_DIO | BIG_WRITES | (1 << 3), flags2: 0 };
        let out = negotiate(&init, 1 << 20, 256);
        assert_eq!(out.len(), 64);
        assert_eq!(u32_at(&out, 0), 7);
        assert_eq!(u32_at(&out, 4), KERNEL_MINOR);
        assert_eq!(u32_at(&out, 12), ASYNC_DIO | BIG_WRITES, "only flags the kernel offered, only wanted ones");
        assert_eq!(u32_at(&out, 20), 1 << 20);
        assert_eq!(u16::from_ne_bytes([out[28], out[29]]), 256);
        let old = Init { minor: 31, flags: 0, ..init };
        assert_eq!(u32_at(&negotiate(&old, 1 << 20, 256), 4), 31);
        assert!(!offers_async_dio(&old));
    }

    #[test]
    fn replies_have_the_kernels_sizes() {
        let a = Attr { ino: 2, size: 1 << 30, mode: S_IFREG | 0o600, nlink: 1, blksize: 4096 };
        assert_eq!(entry(&a, 1).len(), 128);
        assert_eq!(attr_out(&a, 1).len(), 104);
        assert_eq!(u64_at(&attr_out(&a, 1), 24), 1 << 30, "size follows ino");
        assert_eq!(open_out(0, FOPEN_DIRECT_IO).len(), 16);
        assert_eq!(write_out(4096).len(), 8);
        assert_eq!(statfs_out(10, 4096, 1).len(), 80);
        let n = inval_inode(2);
        assert_eq!((n.len(), u32_at(&n, 0) as usize), (40, 40));
    }

    #[test]
    fn directory_entries_stop_where_the_buffer_ends_and_resume_at_their_offset() {
        let entries = [(1, DT_DIR, "."), (1, DT_DIR, ".."), (2, DT_REG, "volume")];
        let all = dirents(&entries, 0, 4096);
        assert_eq!(all.len(), 32 + 32 + 32);
        assert_eq!(dirents(&entries, 0, 40).len(), 32, "one record fits");
        let rest = dirents(&entries, 2, 4096);
        assert_eq!(&rest[24..30], b"volume");
        assert_eq!(u64_at(&rest, 8), 3);
        assert!(dirents(&entries, 3, 4096).is_empty());
    }

    /// A request as the kernel leaves it in a ring entry: the in header in
    /// `in_out`, the operation's header in `op_in`, the rest in the payload.
    fn ring_parts(opcode: u32, unique: u64, op: &[u8], payload: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let full = request(opcode, unique, 2, &[op, payload].concat());
        let mut in_out = vec![0u8; 128];
        in_out[..IN_HEADER].copy_from_slice(&full[..IN_HEADER]);
        let mut op_in = vec![0xeeu8; 128];
        op_in[..op.len()].copy_from_slice(op);
        (in_out, op_in)
    }

    #[test]
    fn a_ring_write_takes_its_data_from_the_payload() {
        let mut op = vec![0u8; 40];
        op[8..16].copy_from_slice(&4096u64.to_ne_bytes());
        op[16..20].copy_from_slice(&5u32.to_ne_bytes());
        let (in_out, op_in) = ring_parts(WRITE, 9, &op, b"hello");
        let r = parse_ring(&in_out, &op_in, b"hello").unwrap();
        assert_eq!(
            r,
            Request { unique: 9, nodeid: 2, op: Op::Write { offset: 4096, data: Bytes::from_static(b"hello") } }
        );
        // The write's size field and the payload the kernel copied disagree.
        let (in_out, op_in) = ring_parts(WRITE, 9, &op, b"hell");
        assert!(matches!(parse_ring(&in_out, &op_in, b"hell"), Err(ParseError::Length { .. })));
    }

    #[test]
    fn a_ring_read_and_lookup_parse_as_from_the_device() {
        let mut op = vec![0u8; 40];
        op[8..16].copy_from_slice(&8192u64.to_ne_bytes());
        op[16..20].copy_from_slice(&4096u32.to_ne_bytes());
        let (in_out, op_in) = ring_parts(READ, 3, &op, &[]);
        assert_eq!(parse_ring(&in_out, &op_in, &[]).unwrap().op, Op::Read { offset: 8192, size: 4096 });
        // A lookup has no header of its own: the name is the payload.
        let (in_out, op_in) = ring_parts(LOOKUP, 4, &[], b"volume\0");
        assert_eq!(parse_ring(&in_out, &op_in, b"volume\0").unwrap().op, Op::Lookup { name: b"volume".to_vec() });
    }

    #[test]
    fn a_ring_header_longer_than_its_parts_is_refused() {
        let (mut in_out, op_in) = ring_parts(GETATTR, 1, &[0u8; 16], &[]);
        in_out[0..4].copy_from_slice(&((IN_HEADER + 129) as u32).to_ne_bytes());
        assert!(matches!(parse_ring(&in_out, &op_in, &[]), Err(ParseError::Length { .. })));
        in_out[0..4].copy_from_slice(&(IN_HEADER as u32 - 1).to_ne_bytes());
        assert!(matches!(parse_ring(&in_out, &op_in, &[]), Err(ParseError::Length { .. })));
        assert!(matches!(parse_ring(&in_out[..20], &op_in, &[]), Err(ParseError::Short { .. })));
    }

    #[test]
    fn a_ring_answer_and_command_are_laid_out_as_the_kernel_reads_them() {
        let mut header = vec![0u8; ring::HEADER];
        header[ring::COMMIT_ID_AT..ring::COMMIT_ID_AT + 8].copy_from_slice(&77u64.to_ne_bytes());
        header[ring::PAYLOAD_SZ_AT..ring::PAYLOAD_SZ_AT + 4].copy_from_slice(&4096u32.to_ne_bytes());
        assert_eq!((ring::commit_id(&header), ring::payload_size(&header)), (77, 4096));
        ring::set_answer(&mut header, 77, -5, 8);
        assert_eq!(&header[..OUT_HEADER], &out_header(OUT_HEADER + 8, -5, 77));
        assert_eq!(ring::payload_size(&header), 8);
        let cmd = ring::cmd_req(77, 1);
        assert_eq!((u64_at(&cmd, 0), u64_at(&cmd, 8), u16::from_ne_bytes([cmd[16], cmd[17]])), (0, 77, 1));
    }

    #[test]
    fn io_uring_is_offered_only_through_the_extended_flags() {
        let init = Init { major: 7, minor: 45, max_readahead: 0, flags: INIT_EXT, flags2: OVER_IO_URING2 };
        assert!(offers_io_uring(&init));
        assert!(!offers_io_uring(&Init { flags: 0, ..init.clone() }));
        assert!(!offers_io_uring(&Init { flags2: 0, ..init }));
        let mut body = vec![0u8; 64];
        body[0..4].copy_from_slice(&7u32.to_ne_bytes());
        body[12..16].copy_from_slice(&INIT_EXT.to_ne_bytes());
        body[16..20].copy_from_slice(&OVER_IO_URING2.to_ne_bytes());
        let Op::Init(init) = parse(&request(INIT, 1, 0, &body)).unwrap().op else { panic!("not INIT") };
        assert!(offers_io_uring(&init));
    }
}
