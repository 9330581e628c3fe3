//! The message codec: round trips, compression, truncation, and hostile input.

use super::*;
use crate::dns::wire::{Counts, Opcode, Soa, Srv, WireError, decode_header};
use rand::Rng;
use std::net::Ipv6Addr;

fn every_record_type() -> Message {
    let owner = name("web.shop.svc.cluster.local");
    let rec = |data| Record::new(owner.clone(), 5, data);
    Message {
        header: Header {
            id: 7,
            response: true,
            authoritative: true,
            recursion_desired: true,
            recursion_available: true,
            ..Header::default()
        },
        rcode: Rcode::NXDOMAIN,
        questions: vec![question("Web.Shop.svc.cluster.local", RecordType::A)],
        answers: vec![
            rec(RData::A(Ipv4Addr::new(10, 96, 0, 20))),
            rec(RData::Aaaa("fd00::20".parse::<Ipv6Addr>().unwrap())),
            rec(RData::Cname(name("example.com"))),
            rec(RData::Ptr(name("db-0.db.shop.svc.cluster.local"))),
            rec(RData::Ns(name("ns.dns.cluster.local"))),
            rec(RData::Srv(Srv {
                priority: 0,
                weight: 100,
                port: 80,
                target: name("web.shop.svc.cluster.local"),
            })),
            rec(RData::Other {
                rtype: RecordType::TXT,
                data: b"\x05hello".to_vec(),
            }),
        ],
        authority: vec![Record::new(
            name("cluster.local"),
            5,
            RData::Soa(Soa {
                mname: name("ns.dns.cluster.local"),
                rname: name("hostmaster.cluster.local"),
                serial: 42,
                refresh: 7200,
                retry: 1800,
                expire: 86400,
                minimum: 5,
            }),
        )],
        additional: vec![rec(RData::A(Ipv4Addr::new(10, 0, 0, 1)))],
        edns: Some(Edns {
            udp_payload: 1232,
            version: 0,
            dnssec_ok: true,
            options: vec![0, 10, 0, 2, 0xab, 0xcd],
        }),
    }
}

#[test]
fn every_record_type_round_trips() {
    let m = every_record_type();
    let bytes = m.encode(65535);
    let back = Message::decode(&bytes).unwrap();
    assert_eq!(back, m);
    // The question keeps the asker's spelling.
    assert_eq!(
        back.questions[0].name.to_string(),
        "Web.Shop.svc.cluster.local."
    );
}

#[test]
fn extended_rcodes_travel_in_the_opt_record() {
    let mut m = every_record_type();
    m.rcode = Rcode::BADVERS;
    let back = Message::decode(&m.encode(65535)).unwrap();
    assert_eq!(back.rcode, Rcode::BADVERS);
    // Without EDNS an extended rcode cannot be said: SERVFAIL instead.
    m.edns = None;
    assert_eq!(
        Message::decode(&m.encode(65535)).unwrap().rcode,
        Rcode::SERVFAIL
    );
}

#[test]
fn header_flags_and_counts_decode() {
    let m = every_record_type();
    let (h, rcode, counts) = decode_header(&m.encode(65535)).unwrap();
    assert_eq!(h, m.header);
    assert_eq!(rcode, Rcode::NXDOMAIN);
    assert_eq!(
        counts,
        Counts {
            questions: 1,
            answers: 7,
            authority: 1,
            additional: 2
        }
    );
    let mut notify = Message::default();
    notify.header.opcode = Opcode(4);
    let (h, _, _) = decode_header(&notify.encode(512)).unwrap();
    assert_eq!(h.opcode, Opcode(4));
}

#[test]
fn repeated_names_are_compressed_but_srv_targets_are_not() {
    let m = every_record_type();
    let compressed = m.encode(65535);
    let owner = name("web.shop.svc.cluster.local");
    let literal = |bytes: &[u8]| {
        bytes
            .windows(owner.as_wire().len())
            .filter(|w| *w == owner.as_wire())
            .count()
    };
    // Eight records are owned by that name, yet it is spelled out only as the SRV target.
    assert_eq!(literal(&compressed), 1);
    let owner_len = owner.as_wire().len();
    // The SRV target appears literally (RFC 2782) although the name was written before.
    let srv_at = compressed
        .windows(6)
        .position(|w| w == [0, 0, 0, 100, 0, 80])
        .unwrap();
    assert_eq!(
        &compressed[srv_at + 6..srv_at + 6 + owner_len],
        name("web.shop.svc.cluster.local").as_wire()
    );
}

#[test]
fn every_truncated_prefix_is_an_error_not_a_panic() {
    let bytes = every_record_type().encode(65535);
    for len in 0..bytes.len() {
        assert!(Message::decode(&bytes[..len]).is_err(), "prefix of {len}");
    }
    assert!(matches!(
        Message::decode(&bytes[..5]),
        Err(WireError::Truncated { .. })
    ));
}

#[test]
fn a_300_byte_query_name_is_rejected() {
    let mut q = query("a.example", RecordType::A);
    q.truncate(12);
    for _ in 0..5 {
        q.push(59);
        q.extend_from_slice(&[b'x'; 59]);
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    assert_eq!(Message::decode(&q), Err(WireError::NameTooLong));
}

#[test]
fn pointer_loops_in_a_message_are_errors() {
    let mut q = query("a.example", RecordType::A);
    q.truncate(12);
    // The question name points at itself.
    q.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    assert!(matches!(
        Message::decode(&q),
        Err(WireError::PointerNotBackward { .. })
    ));
}

#[test]
fn bad_record_data_is_an_error() {
    let base = every_record_type();
    for (data, rtype) in [
        (vec![1, 2, 3], RecordType::A),
        (vec![0; 15], RecordType::AAAA),
        (vec![0, 0, 0], RecordType::SRV),
        (vec![3, b'a', b'b', b'c', 0, 9], RecordType::CNAME),
        (vec![0, 0, 1, 2], RecordType::SOA),
    ] {
        let mut m = base.clone();
        m.answers = vec![Record::new(name("x"), 1, RData::Other { rtype, data })];
        m.authority.clear();
        m.additional.clear();
        let err = Message::decode(&m.encode(65535)).unwrap_err();
        assert!(
            matches!(
                err,
                WireError::BadRdata { .. } | WireError::Truncated { .. }
            ),
            "{rtype}: {err}"
        );
    }
}

#[test]
fn opt_records_must_be_unique_rooted_and_well_framed() {
    let opt = |owner: &str, options: Vec<u8>| {
        Record::new(
            name(owner),
            0,
            RData::Other {
                rtype: RecordType::OPT,
                data: options,
            },
        )
    };
    let with = |additional: Vec<Record>| {
        let mut m = query_message("a.example", RecordType::A, None);
        m.additional = additional;
        Message::decode(&m.encode(4096))
    };
    assert_eq!(
        with(vec![opt(".", vec![]), opt(".", vec![])]),
        Err(WireError::DuplicateOpt)
    );
    assert_eq!(with(vec![opt("x", vec![])]), Err(WireError::OptNotRoot));
    assert_eq!(
        with(vec![opt(".", vec![0, 1, 0, 5, 1])]),
        Err(WireError::BadEdnsOptions)
    );
    let ok = with(vec![opt(".", vec![0, 1, 0, 1, 9])]).unwrap();
    assert_eq!(ok.edns.unwrap().options, vec![0, 1, 0, 1, 9]);
}

#[test]
fn truncation_drops_whole_answers_and_sets_tc_but_not_for_additional_records() {
    let owner = name("big.shop.svc.cluster.local");
    let mut m = query_message("big.shop.svc.cluster.local", RecordType::A, Some(4096));
    m.header.response = true;
    m.answers = (0..100u32)
        .map(|i| Record::new(owner.clone(), 5, RData::A(Ipv4Addr::from(i))))
        .collect();
    let bytes = m.encode(512);
    assert!(bytes.len() <= 512);
    let back = Message::decode(&bytes).unwrap();
    assert!(back.header.truncated);
    assert!(back.answers.len() > 20 && back.answers.len() < 100);
    assert!(back.edns.is_some(), "the OPT record is kept");

    let mut m2 = m.clone();
    m2.additional = std::mem::take(&mut m2.answers);
    m2.answers = vec![Record::new(owner, 5, RData::A(Ipv4Addr::LOCALHOST))];
    let back = Message::decode(&m2.encode(512)).unwrap();
    assert!(!back.header.truncated);
    assert_eq!(back.answers.len(), 1);
    assert!(back.additional.len() < 100);
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = rand::rng();
    for _ in 0..20_000 {
        let len = rng.random_range(0..600);
        let mut buf = vec![0u8; len];
        rng.fill(&mut buf[..]);
        // Small counts make the decoder go deeper than random counts would.
        if len >= 12 && rng.random_bool(0.5) {
            for i in [4, 6, 8, 10] {
                buf[i] = 0;
                buf[i + 1] = rng.random_range(0..4);
            }
        }
        let _ = Message::decode(&buf);
    }
}

#[test]
fn mutated_valid_messages_never_panic() {
    let mut rng = rand::rng();
    let valid = every_record_type().encode(65535);
    for _ in 0..20_000 {
        let mut buf = valid.clone();
        for _ in 0..rng.random_range(1..6) {
            let i = rng.random_range(0..buf.len());
            buf[i] = rng.random();
        }
        buf.truncate(rng.random_range(0..=buf.len()));
        if let Ok(m) = Message::decode(&buf) {
            // Whatever decodes also encodes (within any limit) without panicking.
            let _ = m.encode(512);
            let _ = m.encode(65535);
        }
    }
}
