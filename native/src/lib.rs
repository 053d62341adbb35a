//! Optional native twin of the hot loops in `store/record.py` and
//! `store/recovery.py`: batch encoding of RocketMQ v1 message records and the
//! verify-walk over stored bytes.
//!
//! The Python codec is the reference. Both functions here handle only the
//! common case exactly as the Python code would and *stop* at anything else
//! (an IPv6 host, a message that would not fit, a field the layout cannot hold,
//! damage of any kind), returning how far they got; the caller continues with
//! the Python path from there, which decides and explains. So this module never
//! rejects a record nor accepts one the Python code would not, and the tests
//! cross-check both on the same inputs.
//!
//! Layout of the fixed part (big-endian, 88 bytes, all-IPv4):
//!   0 TOTALSIZE i32      4 MAGICCODE u32     8 BODYCRC i32     12 QUEUEID i32
//!  16 FLAG i32          20 QUEUEOFFSET i64  28 PHYSICALOFFSET i64
//!  36 SYSFLAG i32       40 BORNTIMESTAMP i64 48 BORNHOST 4+4   56 STORETIMESTAMP i64
//!  64 STOREHOST 4+4     72 RECONSUMETIMES i32 76 PREPARED TX OFFSET i64
//!  84 BODY length i32   then BODY, TOPIC (1+n), PROPERTIES (2+n).
//! BODYCRC is CRC-32 of the body with the sign bit cleared.

use std::net::Ipv4Addr;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

const MESSAGE_MAGIC: u32 = 0xDAA3_20A7;
const V4_FIXED: usize = 88;
const MIN_SIZE: usize = V4_FIXED + 3;
const V6_FLAGS: i32 = (1 << 4) | (1 << 5);
const MAX_PROPERTIES: usize = 32767;
const UNIQ_KEY: &str = "UNIQ_KEY";
// store/names.py: TOPIC_MAX_LENGTH and MAX_QUEUE_ID (tests cross-check them).
const TOPIC_MAX_LENGTH: usize = 127;
const MAX_QUEUE_ID: i32 = 1023;

/// RocketMQ's topic rule, ^[%|a-zA-Z0-9_-]+$ and at most 127 characters
/// (store/names.py says why: a topic names a directory).
fn topic_allowed(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= TOPIC_MAX_LENGTH
        && topic.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'%' | b'|' | b'_' | b'-'))
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

fn body_crc(body: &[u8]) -> i32 {
    (crc32fast::hash(body) & 0x7FFF_FFFF) as i32
}

/// Walk valid all-IPv4 message records in `b[pos..limit]`, where `b[0]` sits
/// at absolute offset `base`. Stops at the first position that is not such a
/// record (a blank, zeros, damage, an IPv6 layout, the limit).
fn scan_impl(b: &[u8], mut pos: usize, limit: usize, base: i64) -> (usize, usize, Option<i64>) {
    let limit = limit.min(b.len());
    let mut records = 0usize;
    let mut last_ts = None;
    while pos + 8 <= limit {
        if be_u32(b, pos + 4) != MESSAGE_MAGIC {
            break;
        }
        let size = be_i32(b, pos);
        if size < MIN_SIZE as i32 {
            break;
        }
        let end = pos + size as usize;
        if end > limit {
            break;
        }
        let crc = be_i32(b, pos + 8);
        let phys = be_i64(b, pos + 28);
        let sys_flag = be_i32(b, pos + 36);
        let ts = be_i64(b, pos + 56);
        let body_len = be_i32(b, pos + 84);
        if sys_flag & V6_FLAGS != 0 || phys != base + pos as i64 || body_len < 0 {
            break;
        }
        let body_start = pos + V4_FIXED;
        let body_end = body_start + body_len as usize;
        if body_end + 3 > end || body_crc(&b[body_start..body_end]) != crc {
            break;
        }
        let props_at = body_end + 1 + b[body_end] as usize;
        // PROPERTIES length is a signed short, as RocketMQ (and decode) read it.
        if props_at + 2 > end || {
            let props_len = i16::from_be_bytes([b[props_at], b[props_at + 1]]);
            props_len < 0 || props_at + 2 + props_len as usize != end
        } {
            break;
        }
        pos = end;
        records += 1;
        last_ts = Some(ts);
    }
    (pos, records, last_ts)
}

/// scan(buf, pos, limit, base) -> (stop_pos, records, last_store_timestamp or None)
///
/// The GIL is released while walking, so a slave can receive the next range
/// while this one is verified.
#[pyfunction]
fn scan(py: Python<'_>, buf: PyBuffer<u8>, pos: usize, limit: usize, base: i64)
    -> PyResult<(usize, usize, Option<i64>)> {
    if !buf.is_c_contiguous() {
        return Ok((pos, 0, None));
    }
    let addr = buf.buf_ptr() as usize;
    let len = buf.len_bytes();
    let result = py.allow_threads(move || {
        // SAFETY: `buf` holds a buffer export of a contiguous object for the
        // whole call, so the memory stays valid; we only read it.
        let slice = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        scan_impl(slice, pos, limit, base)
    });
    drop(buf);
    Ok(result)
}

/// Everything one message contributes, or None where the Python path must decide.
struct Parts<'py> {
    topic: Bound<'py, PyString>,
    body: Bound<'py, PyBytes>,
    msg_id: Option<Bound<'py, PyAny>>,
    queue_id: i32,
    queue_id_obj: Bound<'py, PyAny>,
    flag: i32,
    born_ts: i64,
    born_ip: [u8; 4],
    born_port: i32,
}

fn push_property(out: &mut Vec<u8>, k: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>) -> Option<()> {
    let k = k.downcast::<PyString>().ok()?.to_str().ok()?;
    let v = v.downcast::<PyString>().ok()?.to_str().ok()?;
    if k.bytes().chain(v.bytes()).any(|c| c == 1 || c == 2) {
        return None; // a separator inside: MESSAGE_ILLEGAL, said by the Python path
    }
    out.extend_from_slice(k.as_bytes());
    out.push(1);
    out.extend_from_slice(v.as_bytes());
    out.push(2);
    Some(())
}

/// A new instance of the tuple subclass `ty` holding `items`, as
/// tuple.__new__(ty, items) builds it (tp_alloc, then the items).
fn new_tuple_of<'py, const N: usize>(py: Python<'py>, ty: &Bound<'py, PyType>,
                                     items: [Bound<'py, PyAny>; N]) -> PyResult<Bound<'py, PyAny>> {
    // version_info() formats and parses Py_GetVersion() on every call:
    // asked once.
    static CACHED_TUPLE_HASH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *CACHED_TUPLE_HASH.get_or_init(|| py.version_info() >= (3, 14)) {
        // Tuples grew a cached hash there, which zeroed memory would claim:
        // let tuple.__new__ build it.
        let fields = PyTuple::new(py, items)?;
        return py.get_type::<PyTuple>().getattr(pyo3::intern!(py, "__new__"))?
            .call1((ty, fields));
    }
    // SAFETY: `ty` is a tuple subclass (checked by the caller); tp_alloc
    // returns a tuple of N NULL slots, and PyTuple_SetItem steals each item's
    // reference into a fresh object nobody else has seen.
    unsafe {
        let obj = pyo3::ffi::PyType_GenericAlloc(ty.as_type_ptr(), N as pyo3::ffi::Py_ssize_t);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        let obj = Bound::from_owned_ptr(py, obj);
        for (i, item) in items.into_iter().enumerate() {
            if pyo3::ffi::PyTuple_SetItem(obj.as_ptr(), i as pyo3::ffi::Py_ssize_t,
                                          item.into_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(obj)
    }
}

/// The last born host seen and its parsed address: messages of one
/// producer share one host tuple, so it is parsed once per run.
#[derive(Default)]
struct HostCache {
    ptr: usize,
    ip: [u8; 4],
}

fn parts<'py>(py: Python<'py>, msg: &Bound<'py, PyTuple>, max_body: usize,
              hosts: &mut HostCache, props: &mut Vec<u8>) -> Option<Parts<'py>> {
    if msg.len() < 7 {
        return None;
    }
    let topic = msg.get_item(0).ok()?.downcast_into::<PyString>().ok()?;
    let body = msg.get_item(1).ok()?.downcast_into::<PyBytes>().ok()?;
    if body.as_bytes().len() > max_body {
        return None;
    }
    let topic_str = topic.to_str().ok()?;
    if !topic_allowed(topic_str) {
        return None; // MESSAGE_ILLEGAL, said by the Python path (store/names.py)
    }
    let props_obj = msg.get_item(2).ok()?;
    props.clear();
    let mut msg_id = None;
    if let Ok(d) = props_obj.downcast::<PyDict>() {
        for (k, v) in d.iter() {
            push_property(props, &k, &v)?;
        }
        msg_id = d.get_item(pyo3::intern!(py, UNIQ_KEY)).ok()?;
    } else if props_obj.len().ok()? != 0 {
        return None; // another Mapping with entries: the Python path encodes it
    }
    if props.len() > MAX_PROPERTIES {
        return None;
    }
    let queue_id_obj = msg.get_item(3).ok()?;
    let queue_id: i32 = queue_id_obj.extract().ok()?;
    if !(0..=MAX_QUEUE_ID).contains(&queue_id) {
        return None; // MESSAGE_ILLEGAL, said by the Python path
    }
    let flag: i32 = msg.get_item(4).ok()?.extract().ok()?;
    let born_ts: i64 = msg.get_item(5).ok()?.extract().ok()?;
    let born = msg.get_item(6).ok()?;
    let born = born.downcast::<PyTuple>().ok()?;
    if born.len() != 2 {
        return None;
    }
    let host_obj = born.get_item(0).ok()?;
    // The cache is keyed by the string object, and a run holds a reference
    // to every message (so no object is freed and its address reused).
    let born_ip = if hosts.ptr != 0 && hosts.ptr == host_obj.as_ptr() as usize {
        hosts.ip
    } else {
        let host = host_obj.downcast::<PyString>().ok()?.to_str().ok()?;
        let ip = host.parse::<Ipv4Addr>().ok()?.octets();
        hosts.ptr = host_obj.as_ptr() as usize;
        hosts.ip = ip;
        ip
    };
    let born_port: i32 = born.get_item(1).ok()?.extract().ok()?;
    Some(Parts {
        topic, body, msg_id, queue_id, queue_id_obj, flag, born_ts, born_ip, born_port,
    })
}

/// encode_run_into(buf, at, messages, start, pos, limit, queue_offsets, store_ts,
///                 store_host, max_body, results, result_type, ok_status)
///     -> (nbytes, count, full)
///
/// Encode messages[start:] (store.record.Message tuples) as records at `pos`
/// into the bytearray `buf` from index `at`, while each is an ordinary
/// all-IPv4 message that ends at or before `limit` (the placement limit,
/// store/placement.py end_limit: the segment's end less room for a blank;
/// the caller rolls). For each:
/// bump queue_offsets[(topic, queue_id)], append
/// result_type(ok_status, offset, size, msg_id, store_ts, "") to `results`
/// (`result_type` is a tuple subclass of six fields, store.status.PutResult;
/// it is built as tuple.__new__ would, without its Python-level __new__).
/// Returns the bytes written, how many messages they hold, and whether it
/// stopped because the next record does not fit in `buf`; the caller takes
/// over at messages[start + count].
///
/// Writing straight into the caller's reused buffer matters: a fresh buffer
/// per batch faulted in every page of every batch (measured: page faults,
/// not encoding, were most of the cost).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn encode_run_into<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyByteArray>,
    at: usize,
    messages: &Bound<'py, PyAny>,
    start: usize,
    pos: i64,
    limit: i64,
    queue_offsets: &Bound<'py, PyDict>,
    store_ts: i64,
    store_host: &[u8],
    max_body: usize,
    results: &Bound<'py, PyList>,
    result_type: &Bound<'py, PyType>,
    ok_status: &Bound<'py, PyAny>,
) -> PyResult<(usize, usize, bool)> {
    // SAFETY: nothing this function calls can reach `buf` (the callers'
    // buffer is private to the CommitLog, which holds its lock), so it is
    // not resized or freed while the slice lives.
    let out = unsafe { buf.as_bytes_mut() };
    if at > out.len() {
        return Ok((0, 0, false));
    }
    let mut enc = Encoder { out, at, start_at: at };
    let (count, full) = encode_into(py, &mut enc, messages, start, pos, limit, queue_offsets,
                                    store_ts, store_host, max_body, results, result_type,
                                    ok_status)?;
    Ok((enc.at - enc.start_at, count, full))
}

/// A bounded cursor over the output buffer.
struct Encoder<'a> {
    out: &'a mut [u8],
    at: usize,
    start_at: usize,
}

impl Encoder<'_> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

/// The (topic, queue) whose queue offset the run is counting, written back
/// to the dict when the key changes and when the run ends: one dict lookup
/// per run of one queue instead of two per message.
struct QueueCursor<'py> {
    topic: Bound<'py, PyString>,
    queue_id: i32,
    key: Bound<'py, PyTuple>,
    next: i64,
}

fn put_back(queue_offsets: &Bound<'_, PyDict>, cur: &Option<QueueCursor<'_>>) -> PyResult<()> {
    if let Some(c) = cur {
        queue_offsets.set_item(&c.key, c.next)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn encode_into<'py>(
    py: Python<'py>,
    enc: &mut Encoder<'_>,
    messages: &Bound<'py, PyAny>,
    start: usize,
    pos: i64,
    limit: i64,
    queue_offsets: &Bound<'py, PyDict>,
    store_ts: i64,
    store_host: &[u8],
    max_body: usize,
    results: &Bound<'py, PyList>,
    result_type: &Bound<'py, PyType>,
    ok_status: &Bound<'py, PyAny>,
) -> PyResult<(usize, bool)> {
    // SAFETY: a pointer comparison of two live type objects.
    if unsafe { pyo3::ffi::PyType_IsSubtype(result_type.as_type_ptr(),
                                           std::ptr::addr_of_mut!(pyo3::ffi::PyTuple_Type)) } == 0 {
        return Err(pyo3::exceptions::PyTypeError::new_err("result_type must subclass tuple"));
    }
    let mut count = 0usize;
    let mut full = false;
    let mut at = pos;
    let mut cur: Option<QueueCursor<'py>> = None;
    let mut hosts = HostCache::default();
    let mut props: Vec<u8> = Vec::with_capacity(256);
    let mut size_obj: Option<(usize, Bound<'py, PyAny>)> = None;
    let empty = pyo3::intern!(py, "").clone().into_any();
    let ts_obj = store_ts.into_pyobject(py)?.into_any();
    if store_host.len() == 8 {
        let n = messages.len()?;
        let mut i = start;
        while i < n {
            let item = messages.get_item(i)?;
            let Ok(msg) = item.downcast::<PyTuple>() else { break };
            let Some(p) = parts(py, msg, max_body, &mut hosts, &mut props) else { break };
            let body = p.body.as_bytes();
            let topic_bytes = p.topic.to_str()?.as_bytes();
            let size = V4_FIXED + body.len() + 1 + topic_bytes.len() + 2 + props.len();
            if at + size as i64 > limit {
                break;
            }
            if enc.at + size > enc.out.len() {
                full = true;
                break;
            }
            let same = matches!(&cur, Some(c) if c.queue_id == p.queue_id
                && (c.topic.is(&p.topic) || c.topic.to_str()? == p.topic.to_str()?));
            if !same {
                put_back(queue_offsets, &cur)?;
                let key = PyTuple::new(py, [p.topic.as_any(), &p.queue_id_obj])?;
                let q: i64 = match queue_offsets.get_item(&key)? {
                    Some(v) => match v.extract() { Ok(q) => q, Err(_) => { cur = None; break } },
                    None => 0,
                };
                cur = Some(QueueCursor { topic: p.topic.clone(), queue_id: p.queue_id, key,
                                         next: q });
            }
            let c = cur.as_mut().expect("set above");
            let q = c.next;
            let Some(next_q) = q.checked_add(1) else { break };
            c.next = next_q;
            enc.put(&(size as i32).to_be_bytes());
            enc.put(&MESSAGE_MAGIC.to_be_bytes());
            enc.put(&body_crc(body).to_be_bytes());
            enc.put(&p.queue_id.to_be_bytes());
            enc.put(&p.flag.to_be_bytes());
            enc.put(&q.to_be_bytes());
            enc.put(&at.to_be_bytes());
            enc.put(&0i32.to_be_bytes()); // SYSFLAG: both hosts IPv4
            enc.put(&p.born_ts.to_be_bytes());
            enc.put(&p.born_ip);
            enc.put(&p.born_port.to_be_bytes());
            enc.put(&store_ts.to_be_bytes());
            enc.put(store_host);
            enc.put(&0i32.to_be_bytes()); // RECONSUMETIMES
            enc.put(&0i64.to_be_bytes()); // PREPARED TRANSACTION OFFSET
            enc.put(&(body.len() as i32).to_be_bytes());
            enc.put(body);
            enc.put(&[topic_bytes.len() as u8]);
            enc.put(topic_bytes);
            enc.put(&(props.len() as u16).to_be_bytes());
            enc.put(&props);
            let msg_id = match &p.msg_id {
                Some(m) => m.clone(),
                None => py.None().into_bound(py),
            };
            // Records of one batch mostly share a size: one int object.
            let size_py = match &size_obj {
                Some((n, o)) if *n == size => o.clone(),
                _ => {
                    let o = size.into_pyobject(py)?.into_any();
                    size_obj = Some((size, o.clone()));
                    o
                }
            };
            let result = new_tuple_of(py, result_type, [ok_status.clone(),
                                      at.into_pyobject(py)?.into_any(), size_py, msg_id,
                                      ts_obj.clone(), empty.clone()])?;
            results.append(result)?;
            at += size as i64;
            count += 1;
            i += 1;
        }
    }
    put_back(queue_offsets, &cur)?;
    Ok((count, full))
}

/// One (topic, queue) run of units found by `reput_groups`.
struct Group {
    topic: Vec<u8>,
    queue_id: i32,
    contiguous: bool,
    qos: Vec<i64>,
    offsets: Vec<i64>,
    sizes: Vec<i32>,
    tags: Vec<i64>,
}

/// Java's String.hashCode over the UTF-16 code units (RocketMQ's tag code).
fn java_hash(s: &str) -> i64 {
    let mut h: i32 = 0;
    for u in s.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(u as i32);
    }
    h as i64
}

/// The TAGS value's hash, 0 without one; None where the Python path must
/// decide (properties that are not UTF-8).
fn tag_hash(props: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(props).ok()?;
    let mut found: Option<&str> = None;
    for item in text.split('\u{2}') {
        if let Some((name, value)) = item.split_once('\u{1}') {
            if name == "TAGS" {
                found = Some(value); // the last one wins, as in a dict
            }
        }
    }
    Some(match found {
        Some(v) if !v.is_empty() => java_hash(v),
        _ => 0,
    })
}

fn reput_impl(b: &[u8], base: i64) -> (usize, Option<i64>, Vec<Group>) {
    let mut pos = 0usize;
    let mut last_ts = None;
    let mut groups: Vec<Group> = Vec::new();
    // Keys borrow the topic bytes from `b`: one copy per group, not per record.
    let mut index: std::collections::HashMap<(&[u8], i32), usize> =
        std::collections::HashMap::new();
    while pos + 8 <= b.len() {
        let size = be_i32(b, pos);
        if be_u32(b, pos + 4) != MESSAGE_MAGIC || size < MIN_SIZE as i32 {
            break; // a blank, zeros or anything else: the caller decides
        }
        let end = pos + size as usize;
        if end > b.len() || be_i32(b, pos + 36) & V6_FLAGS != 0 {
            break;
        }
        let queue_id = be_i32(b, pos + 12);
        let qo = be_i64(b, pos + 20);
        let ts = be_i64(b, pos + 56);
        let body_len = be_i32(b, pos + 84);
        if body_len < 0 {
            break;
        }
        let t = pos + V4_FIXED + body_len as usize;
        if t + 1 > end {
            break;
        }
        let tlen = b[t] as usize;
        let p = t + 1 + tlen;
        if p + 2 > end {
            break;
        }
        let plen = u16::from_be_bytes([b[p], b[p + 1]]) as usize;
        if p + 2 + plen > end || std::str::from_utf8(&b[t + 1..p]).is_err() {
            break;
        }
        let Some(tag) = tag_hash(&b[p + 2..p + 2 + plen]) else { break };
        let topic = &b[t + 1..p];
        let g = *index.entry((topic, queue_id)).or_insert_with(|| {
            groups.push(Group { topic: topic.to_vec(), queue_id, contiguous: true,
                                qos: Vec::new(), offsets: Vec::new(), sizes: Vec::new(),
                                tags: Vec::new() });
            groups.len() - 1
        });
        let grp = &mut groups[g];
        if let Some(&prev) = grp.qos.last() {
            if prev.checked_add(1) != Some(qo) {
                grp.contiguous = false;
            }
        }
        grp.qos.push(qo);
        grp.offsets.push(base + pos as i64);
        grp.sizes.push(size);
        grp.tags.push(tag);
        last_ts = Some(ts);
        pos = end;
    }
    (pos, last_ts, groups)
}

fn ne_bytes<'py, T: Copy, const N: usize>(py: Python<'py>, v: &[T], to: impl Fn(T) -> [u8; N])
    -> Bound<'py, PyBytes> {
    let mut out = Vec::with_capacity(v.len() * N);
    for x in v {
        out.extend_from_slice(&to(*x));
    }
    PyBytes::new(py, &out)
}

/// reput_groups(buf, base) -> (stop_pos, last_store_timestamp or None, groups)
///
/// The ConsumeQueue units of the all-IPv4 message records at the start of
/// `buf` (at absolute offset `base`), grouped by (topic, queue id) in order
/// of first appearance: (topic, queue_id, contiguous, qos, offsets, sizes,
/// tags), the last four as native-endian i64/i64/i32/i64 arrays in bytes.
/// Stops at a blank, the end, or anything the Python path must decide.
#[pyfunction]
fn reput_groups<'py>(py: Python<'py>, buf: PyBuffer<u8>, base: i64)
    -> PyResult<(usize, Option<i64>, Bound<'py, PyList>)> {
    if !buf.is_c_contiguous() {
        return Ok((0, None, PyList::empty(py)));
    }
    let addr = buf.buf_ptr() as usize;
    let len = buf.len_bytes();
    let (stop, last_ts, groups) = py.allow_threads(move || {
        // SAFETY: as in `scan`: the buffer export keeps the memory valid.
        let slice = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        reput_impl(slice, base)
    });
    drop(buf);
    let out = PyList::empty(py);
    for g in groups {
        let topic = String::from_utf8(g.topic).unwrap_or_default();
        let item = PyTuple::new(py, [
            PyString::new(py, &topic).into_any(),
            g.queue_id.into_pyobject(py)?.into_any(),
            pyo3::types::PyBool::new(py, g.contiguous).to_owned().into_any(),
            ne_bytes(py, &g.qos, i64::to_ne_bytes).into_any(),
            ne_bytes(py, &g.offsets, i64::to_ne_bytes).into_any(),
            ne_bytes(py, &g.sizes, i32::to_ne_bytes).into_any(),
            ne_bytes(py, &g.tags, i64::to_ne_bytes).into_any(),
        ])?;
        out.append(item)?;
    }
    Ok((stop, last_ts, out))
}

#[pymodule]
fn dlab_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // What store/native.py expects: 2 since encode_run_into's `limit` is
    // where a record may end (store/placement.py), not the segment's end.
    m.add("ABI", 2)?;
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(encode_run_into, m)?)?;
    m.add_function(wrap_pyfunction!(reput_groups, m)?)?;
    Ok(())
}
