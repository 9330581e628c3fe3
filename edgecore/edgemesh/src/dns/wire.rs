//! The DNS message codec: RFC 1035 header, questions and resource records (A, AAAA, CNAME,
//! NS, PTR, SRV, SOA; others kept opaque), EDNS0's OPT record (RFC 6891).
//!
//! Decoding never panics and allocates at most in proportion to its input: every count in
//! the header is only a bound on a loop that consumes bytes. Encoding compresses names and
//! truncates to a size limit by whole records (RFC 2181 §9).

use super::name::Name;
use std::collections::HashMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

pub const HEADER_LEN: usize = 12;
/// Largest message a TCP frame carries.
pub const MAX_MESSAGE_LEN: usize = 65535;
/// Classic UDP limit without EDNS0 (RFC 1035 §4.2.1).
pub const MIN_UDP_LIMIT: usize = 512;
/// Encoded size of an OPT record without options.
const OPT_LEN: usize = 11;
/// Compression pointers have 14 bits.
const MAX_POINTER_TARGET: usize = 0x3fff;

/// Why bytes are not a valid DNS message (or a text name not a valid name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message ends inside {what} (at byte {at})")]
    Truncated { what: &'static str, at: usize },
    #[error("a name longer than 255 bytes")]
    NameTooLong,
    #[error("a label of {len} bytes (at most 63)")]
    LabelTooLong { len: usize },
    #[error("an empty label inside a name")]
    EmptyLabel,
    #[error("reserved label type {byte:#04x} at byte {at}")]
    ReservedLabelType { at: usize, byte: u8 },
    #[error("compression pointer at byte {at} to {target}, not before the labels it continues")]
    PointerNotBackward { at: usize, target: usize },
    #[error("too many compression pointers in one name")]
    TooManyPointers,
    #[error("{rtype} record data: {reason}")]
    BadRdata {
        rtype: RecordType,
        reason: &'static str,
    },
    #[error("an OPT record owned by a name other than the root")]
    OptNotRoot,
    #[error("more than one OPT record")]
    DuplicateOpt,
    #[error("EDNS options overrun their record")]
    BadEdnsOptions,
}

/// A record type (a number: every value is valid on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordType(pub u16);

impl RecordType {
    pub const A: RecordType = RecordType(1);
    pub const NS: RecordType = RecordType(2);
    pub const CNAME: RecordType = RecordType(5);
    pub const SOA: RecordType = RecordType(6);
    pub const PTR: RecordType = RecordType(12);
    pub const MX: RecordType = RecordType(15);
    pub const TXT: RecordType = RecordType(16);
    pub const AAAA: RecordType = RecordType(28);
    pub const SRV: RecordType = RecordType(33);
    pub const OPT: RecordType = RecordType(41);
    pub const ANY: RecordType = RecordType(255);
}

impl fmt::Display for RecordType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            RecordType::A => "A",
            RecordType::NS => "NS",
            RecordType::CNAME => "CNAME",
            RecordType::SOA => "SOA",
            RecordType::PTR => "PTR",
            RecordType::MX => "MX",
            RecordType::TXT => "TXT",
            RecordType::AAAA => "AAAA",
            RecordType::SRV => "SRV",
            RecordType::OPT => "OPT",
            RecordType::ANY => "ANY",
            RecordType(n) => return write!(f, "TYPE{n}"),
        };
        f.write_str(name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Class(pub u16);

impl Class {
    pub const IN: Class = Class(1);
    pub const CH: Class = Class(3);
    pub const ANY: Class = Class(255);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Opcode(pub u8);

impl Opcode {
    pub const QUERY: Opcode = Opcode(0);
}

/// A response code, extended to 12 bits by EDNS0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rcode(pub u16);

impl Rcode {
    pub const NOERROR: Rcode = Rcode(0);
    pub const FORMERR: Rcode = Rcode(1);
    pub const SERVFAIL: Rcode = Rcode(2);
    pub const NXDOMAIN: Rcode = Rcode(3);
    pub const NOTIMP: Rcode = Rcode(4);
    pub const REFUSED: Rcode = Rcode(5);
    /// EDNS version not supported (RFC 6891 §6.1.3).
    pub const BADVERS: Rcode = Rcode(16);
}

/// The header without its counts (they follow from the sections) and rcode (on
/// [`Message`], where EDNS0 can extend it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub id: u16,
    pub response: bool,
    pub opcode: Opcode,
    pub authoritative: bool,
    pub truncated: bool,
    pub recursion_desired: bool,
    pub recursion_available: bool,
    pub authentic_data: bool,
    pub checking_disabled: bool,
}

/// The four section counts of a header as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub questions: u16,
    pub answers: u16,
    pub authority: u16,
    pub additional: u16,
}

/// Reads the fixed header: what can be answered even when the rest is malformed.
pub fn decode_header(msg: &[u8]) -> Result<(Header, Rcode, Counts), WireError> {
    let h = msg.get(..HEADER_LEN).ok_or(WireError::Truncated {
        what: "the header",
        at: msg.len(),
    })?;
    let word = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
    let flags = word(2);
    let bit = |n: u16| flags & (1 << n) != 0;
    let header = Header {
        id: word(0),
        response: bit(15),
        opcode: Opcode(((flags >> 11) & 0xf) as u8),
        authoritative: bit(10),
        truncated: bit(9),
        recursion_desired: bit(8),
        recursion_available: bit(7),
        authentic_data: bit(5),
        checking_disabled: bit(4),
    };
    let counts = Counts {
        questions: word(4),
        answers: word(6),
        authority: word(8),
        additional: word(10),
    };
    Ok((header, Rcode(flags & 0xf), counts))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub name: Name,
    pub qtype: RecordType,
    pub qclass: Class,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    pub target: Name,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Soa {
    pub mname: Name,
    pub rname: Name,
    pub serial: u32,
    pub refresh: u32,
    pub retry: u32,
    pub expire: u32,
    pub minimum: u32,
}

/// Record data. `Other` is opaque: names inside it may be compressed against the message
/// it came from, so it is only re-encoded for types that cannot hold compressed names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    Cname(Name),
    Ns(Name),
    Ptr(Name),
    Srv(Srv),
    Soa(Soa),
    Other { rtype: RecordType, data: Vec<u8> },
}

impl RData {
    pub fn rtype(&self) -> RecordType {
        match self {
            RData::A(_) => RecordType::A,
            RData::Aaaa(_) => RecordType::AAAA,
            RData::Cname(_) => RecordType::CNAME,
            RData::Ns(_) => RecordType::NS,
            RData::Ptr(_) => RecordType::PTR,
            RData::Srv(_) => RecordType::SRV,
            RData::Soa(_) => RecordType::SOA,
            RData::Other { rtype, .. } => *rtype,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: Name,
    pub class: Class,
    pub ttl: u32,
    pub data: RData,
}

impl Record {
    /// A record of class IN.
    pub fn new(name: Name, ttl: u32, data: RData) -> Record {
        Record {
            name,
            class: Class::IN,
            ttl,
            data,
        }
    }

    pub fn rtype(&self) -> RecordType {
        self.data.rtype()
    }
}

/// The OPT pseudo-record (RFC 6891): the sender's UDP payload size and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edns {
    pub udp_payload: u16,
    pub version: u8,
    pub dnssec_ok: bool,
    /// The options, still encoded (their framing is checked when decoding).
    pub options: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub header: Header,
    pub rcode: Rcode,
    pub questions: Vec<Question>,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    pub additional: Vec<Record>,
    pub edns: Option<Edns>,
}

impl Message {
    pub fn decode(msg: &[u8]) -> Result<Message, WireError> {
        let (header, rcode_low, counts) = decode_header(msg)?;
        let mut r = Reader {
            msg,
            pos: HEADER_LEN,
        };
        let mut m = Message {
            header,
            rcode: rcode_low,
            ..Message::default()
        };
        for _ in 0..counts.questions {
            m.questions.push(r.question()?);
        }
        for _ in 0..counts.answers {
            m.answers.push(r.record()?);
        }
        for _ in 0..counts.authority {
            m.authority.push(r.record()?);
        }
        for _ in 0..counts.additional {
            let rec = r.record()?;
            let RData::Other {
                rtype: RecordType::OPT,
                data,
            } = rec.data
            else {
                m.additional.push(rec);
                continue;
            };
            if m.edns.is_some() {
                return Err(WireError::DuplicateOpt);
            }
            if !rec.name.is_root() {
                return Err(WireError::OptNotRoot);
            }
            check_options(&data)?;
            let [ext_rcode, version, flags_hi, _] = rec.ttl.to_be_bytes();
            m.rcode = Rcode((u16::from(ext_rcode) << 4) | rcode_low.0);
            m.edns = Some(Edns {
                udp_payload: rec.class.0,
                version,
                dnssec_ok: flags_hi & 0x80 != 0,
                options: data,
            });
        }
        Ok(m)
    }

    /// Encodes with name compression, at most `limit` bytes (clamped to 512..=65535). What
    /// does not fit is left out by whole records: missing answers or authority set TC;
    /// missing additional records do not (RFC 2181 §9). The OPT record always fits.
    pub fn encode(&self, limit: usize) -> Vec<u8> {
        let limit = limit.clamp(MIN_UDP_LIMIT, MAX_MESSAGE_LEN);
        let opt_len = self.edns.as_ref().map_or(0, |e| OPT_LEN + e.options.len());
        let room = limit.saturating_sub(opt_len);
        let mut e = Encoder::new();
        e.buf.extend_from_slice(&[0; HEADER_LEN]);
        let mut counts = [0u16; 4];
        let mut truncated = false;
        for q in &self.questions {
            let mark = e.buf.len();
            e.question(q);
            if e.buf.len() > room {
                e.rollback(mark);
                truncated = true;
                break;
            }
            counts[0] += 1;
        }
        let sections = [&self.answers, &self.authority, &self.additional];
        for (i, records) in sections.into_iter().enumerate() {
            if truncated {
                break;
            }
            for rec in records {
                let mark = e.buf.len();
                if counts[i + 1] == u16::MAX || !e.record(rec) || e.buf.len() > room {
                    e.rollback(mark);
                    truncated = i < 2;
                    break;
                }
                counts[i + 1] += 1;
            }
        }
        let ext_rcode = (self.rcode.0 >> 4) as u8;
        if let Some(edns) = &self.edns
            && e.buf.len() + opt_len <= limit
        {
            e.opt(edns, ext_rcode);
            counts[3] += 1;
        }
        let rcode_low = if ext_rcode != 0 && self.edns.is_none() {
            Rcode::SERVFAIL.0
        } else {
            self.rcode.0 & 0xf
        };
        let h = &self.header;
        let flag = |on: bool, n: u16| if on { 1u16 << n } else { 0 };
        let flags = flag(h.response, 15)
            | (u16::from(h.opcode.0 & 0xf) << 11)
            | flag(h.authoritative, 10)
            | flag(truncated || h.truncated, 9)
            | flag(h.recursion_desired, 8)
            | flag(h.recursion_available, 7)
            | flag(h.authentic_data, 5)
            | flag(h.checking_disabled, 4)
            | rcode_low;
        let mut head = Vec::with_capacity(HEADER_LEN);
        for w in [h.id, flags, counts[0], counts[1], counts[2], counts[3]] {
            head.extend_from_slice(&w.to_be_bytes());
        }
        e.buf[..HEADER_LEN].copy_from_slice(&head);
        e.buf
    }
}

fn check_options(mut data: &[u8]) -> Result<(), WireError> {
    while !data.is_empty() {
        let len = match data {
            [_, _, hi, lo, ..] => usize::from(u16::from_be_bytes([*hi, *lo])),
            _ => return Err(WireError::BadEdnsOptions),
        };
        data = data.get(4 + len..).ok_or(WireError::BadEdnsOptions)?;
    }
    Ok(())
}

/// A cursor over a message being decoded.
pub(crate) struct Reader<'a> {
    pub(crate) msg: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(WireError::Truncated { what, at: self.pos })?;
        let bytes = self
            .msg
            .get(self.pos..end)
            .ok_or(WireError::Truncated { what, at: self.pos })?;
        self.pos = end;
        Ok(bytes)
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn name(&mut self) -> Result<Name, WireError> {
        let (name, next) = Name::decode(self.msg, self.pos)?;
        self.pos = next;
        Ok(name)
    }

    pub(crate) fn question(&mut self) -> Result<Question, WireError> {
        Ok(Question {
            name: self.name()?,
            qtype: RecordType(self.u16("a question")?),
            qclass: Class(self.u16("a question")?),
        })
    }

    fn record(&mut self) -> Result<Record, WireError> {
        let name = self.name()?;
        let rtype = RecordType(self.u16("a record header")?);
        let class = Class(self.u16("a record header")?);
        let ttl = self.u32("a record header")?;
        let len = usize::from(self.u16("a record header")?);
        let start = self.pos;
        let rdata = self.take(len, "record data")?;
        let end = self.pos;
        let bad = |reason| WireError::BadRdata { rtype, reason };
        // A name inside record data must end exactly where the data ends.
        let name_at = |at: usize| -> Result<Name, WireError> {
            match Name::decode(self.msg, at)? {
                (n, next) if next == end => Ok(n),
                _ => Err(bad("a name does not fill the record data")),
            }
        };
        let data = match rtype {
            RecordType::A => RData::A(Ipv4Addr::from(
                <[u8; 4]>::try_from(rdata).map_err(|_| bad("not 4 bytes"))?,
            )),
            RecordType::AAAA => RData::Aaaa(Ipv6Addr::from(
                <[u8; 16]>::try_from(rdata).map_err(|_| bad("not 16 bytes"))?,
            )),
            RecordType::CNAME => RData::Cname(name_at(start)?),
            RecordType::NS => RData::Ns(name_at(start)?),
            RecordType::PTR => RData::Ptr(name_at(start)?),
            RecordType::SRV => {
                let fixed = rdata.get(..6).ok_or(bad("shorter than 6 bytes"))?;
                let word = |i: usize| u16::from_be_bytes([fixed[i], fixed[i + 1]]);
                RData::Srv(Srv {
                    priority: word(0),
                    weight: word(2),
                    port: word(4),
                    target: name_at(start + 6)?,
                })
            }
            RecordType::SOA => {
                let (mname, after) = Name::decode(self.msg, start)?;
                let (rname, after) = Name::decode(self.msg, after)?;
                if after + 20 != end {
                    return Err(bad("not two names and five numbers"));
                }
                let mut nums = Reader {
                    msg: self.msg,
                    pos: after,
                };
                RData::Soa(Soa {
                    mname,
                    rname,
                    serial: nums.u32("SOA")?,
                    refresh: nums.u32("SOA")?,
                    retry: nums.u32("SOA")?,
                    expire: nums.u32("SOA")?,
                    minimum: nums.u32("SOA")?,
                })
            }
            _ => RData::Other {
                rtype,
                data: rdata.to_vec(),
            },
        };
        Ok(Record {
            name,
            class,
            ttl,
            data,
        })
    }
}

/// Builds a message, remembering where names were written so later ones can point there.
struct Encoder {
    buf: Vec<u8>,
    /// Uncompressed wire form of a name suffix (spelled exactly as written) → its offset.
    names: HashMap<Box<[u8]>, u16>,
}

impl Encoder {
    fn new() -> Encoder {
        Encoder {
            buf: Vec::with_capacity(512),
            names: HashMap::new(),
        }
    }

    fn rollback(&mut self, len: usize) {
        self.buf.truncate(len);
        self.names.retain(|_, at| usize::from(*at) < len);
    }

    fn name(&mut self, name: &Name, compress: bool) {
        for (offset, suffix) in name.suffixes() {
            if compress && let Some(&at) = self.names.get(suffix) {
                self.buf.extend_from_slice(&(0xc000 | at).to_be_bytes());
                return;
            }
            let here = self.buf.len();
            if here <= MAX_POINTER_TARGET && !self.names.contains_key(suffix) {
                self.names.insert(suffix.into(), here as u16);
            }
            let len = usize::from(suffix[0]);
            self.buf
                .extend_from_slice(&name.as_wire()[offset..offset + 1 + len]);
        }
        self.buf.push(0);
    }

    fn question(&mut self, q: &Question) {
        self.name(&q.name, true);
        self.buf.extend_from_slice(&q.qtype.0.to_be_bytes());
        self.buf.extend_from_slice(&q.qclass.0.to_be_bytes());
    }

    /// False when the record data does not fit its 16-bit length.
    fn record(&mut self, r: &Record) -> bool {
        self.name(&r.name, true);
        for w in [r.rtype().0, r.class.0] {
            self.buf.extend_from_slice(&w.to_be_bytes());
        }
        self.buf.extend_from_slice(&r.ttl.to_be_bytes());
        let len_at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        match &r.data {
            RData::A(ip) => self.buf.extend_from_slice(&ip.octets()),
            RData::Aaaa(ip) => self.buf.extend_from_slice(&ip.octets()),
            RData::Cname(n) | RData::Ns(n) | RData::Ptr(n) => self.name(n, true),
            RData::Srv(s) => {
                for w in [s.priority, s.weight, s.port] {
                    self.buf.extend_from_slice(&w.to_be_bytes());
                }
                // RFC 2782: the target is not compressed.
                self.name(&s.target, false);
            }
            RData::Soa(s) => {
                self.name(&s.mname, true);
                self.name(&s.rname, true);
                for n in [s.serial, s.refresh, s.retry, s.expire, s.minimum] {
                    self.buf.extend_from_slice(&n.to_be_bytes());
                }
            }
            RData::Other { data, .. } => self.buf.extend_from_slice(data),
        }
        let Ok(len) = u16::try_from(self.buf.len() - len_at - 2) else {
            return false;
        };
        self.buf[len_at..len_at + 2].copy_from_slice(&len.to_be_bytes());
        true
    }

    fn opt(&mut self, edns: &Edns, ext_rcode: u8) {
        self.buf.push(0);
        self.buf.extend_from_slice(&RecordType::OPT.0.to_be_bytes());
        self.buf.extend_from_slice(&edns.udp_payload.to_be_bytes());
        let flags: u8 = if edns.dnssec_ok { 0x80 } else { 0 };
        self.buf
            .extend_from_slice(&[ext_rcode, edns.version, flags, 0]);
        // The caller made sure the options fit (at most `limit` bytes in all).
        let len = u16::try_from(edns.options.len()).unwrap_or(0);
        self.buf.extend_from_slice(&len.to_be_bytes());
        if len > 0 {
            self.buf.extend_from_slice(&edns.options);
        }
    }
}
