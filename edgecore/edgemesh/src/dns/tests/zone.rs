//! The cluster zone: every record the Kubernetes DNS specification defines, NXDOMAIN versus
//! NODATA, and what is left to the upstreams.

use super::*;
use crate::dns::wire::Srv;
use crate::dns::zone::{Lookup, ZoneAnswer, dashed, reverse_ip, undash};

fn ask(qname: &str, qtype: RecordType) -> ZoneAnswer {
    match zone().lookup(&snapshot(), &question(qname, qtype)) {
        Lookup::Answer(a) => a,
        Lookup::NotMine => panic!("{qname} {qtype} not answered locally"),
    }
}

fn is_nodata(a: &ZoneAnswer) -> bool {
    a.rcode == Rcode::NOERROR
        && a.answers.is_empty()
        && matches!(a.authority.as_slice(), [r] if r.rtype() == RecordType::SOA)
}

fn srvs(a: &ZoneAnswer) -> Vec<(u16, String)> {
    let mut out: Vec<(u16, String)> = a
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::Srv(Srv { port, target, .. }) => (*port, target.to_string()),
            other => panic!("not SRV: {other:?}"),
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_service_name_resolves_to_its_cluster_ip_of_the_asked_family() {
    let a = ask("web.shop.svc.cluster.local", RecordType::A);
    assert_eq!(a.rcode, Rcode::NOERROR);
    assert_eq!(ips(&a.answers), [ip("10.96.0.20")]);
    assert_eq!(a.answers[0].ttl, 5);
    let aaaa = ask("web.shop.svc.cluster.local", RecordType::AAAA);
    assert_eq!(ips(&aaaa.answers), [ip("fd00::20")]);
    let any = ask("web.shop.svc.cluster.local", RecordType::ANY);
    assert_eq!(ips(&any.answers), [ip("10.96.0.20"), ip("fd00::20")]);
}

#[test]
fn a_headless_service_resolves_to_its_ready_endpoints() {
    let a = ask("db.shop.svc.cluster.local", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.88.1.1"), ip("10.88.1.2")]);
    let aaaa = ask("db.shop.svc.cluster.local", RecordType::AAAA);
    assert_eq!(ips(&aaaa.answers), [ip("fd00::1:4")]);
}

#[test]
fn headless_endpoints_are_named_by_hostname_or_dashed_ip() {
    let a = ask("db-0.db.shop.svc.cluster.local", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.88.1.1")]);
    let a = ask("10-88-1-2.db.shop.svc.cluster.local", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.88.1.2")]);
    let a = ask("fd00--1-4.db.shop.svc.cluster.local", RecordType::AAAA);
    assert_eq!(ips(&a.answers), [ip("fd00::1:4")]);
    // An endpoint with a hostname is not also named by its address; not-ready ones not at all.
    for missing in ["10-88-1-1", "10-88-1-3", "db-9"] {
        let a = ask(
            &format!("{missing}.db.shop.svc.cluster.local"),
            RecordType::A,
        );
        assert_eq!(a.rcode, Rcode::NXDOMAIN, "{missing}");
    }
    // Endpoint names exist only below headless Services.
    let a = ask("10-77-0-9.web.shop.svc.cluster.local", RecordType::A);
    assert_eq!(a.rcode, Rcode::NXDOMAIN);
}

#[test]
fn srv_for_a_named_port_points_at_the_service_with_its_address_as_additional() {
    let a = ask("_http._tcp.web.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(srvs(&a), [(80, "web.shop.svc.cluster.local.".into())]);
    assert_eq!(
        a.answers[0].name,
        name("_http._tcp.web.shop.svc.cluster.local")
    );
    assert_eq!(ips(&a.additional), [ip("10.96.0.20"), ip("fd00::20")]);
    let udp = ask("_dns._udp.web.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(srvs(&udp), [(53, "web.shop.svc.cluster.local.".into())]);
    // The wrong protocol, or a port name that does not exist: no such name.
    for missing in ["_http._udp", "_nope._tcp", "_._tcp"] {
        let a = ask(
            &format!("{missing}.web.shop.svc.cluster.local"),
            RecordType::SRV,
        );
        assert_eq!(a.rcode, Rcode::NXDOMAIN, "{missing}");
    }
}

#[test]
fn srv_for_a_headless_port_lists_each_ready_endpoint_with_its_own_port() {
    let a = ask("_pg._tcp.db.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(
        srvs(&a),
        [
            (15432, "10-88-1-2.db.shop.svc.cluster.local.".into()),
            (15432, "db-0.db.shop.svc.cluster.local.".into()),
            (15432, "fd00--1-4.db.shop.svc.cluster.local.".into()),
        ]
    );
    assert_eq!(
        ips(&a.additional),
        [ip("10.88.1.1"), ip("10.88.1.2"), ip("fd00::1:4")]
    );
    let weights: Vec<u16> = a
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::Srv(s) => s.weight,
            _ => 0,
        })
        .collect();
    assert_eq!(weights, [33, 33, 33]);
}

#[test]
fn srv_on_the_service_name_lists_every_port() {
    let a = ask("web.shop.svc.cluster.local", RecordType::SRV);
    let ports: Vec<u16> = srvs(&a).into_iter().map(|(p, _)| p).collect();
    assert_eq!(ports, [53, 80, 81]);
}

#[test]
fn an_external_name_service_is_a_cname_left_for_upstream_resolution() {
    let a = ask("ext.shop.svc.cluster.local", RecordType::A);
    assert_eq!(a.answers.len(), 1);
    assert_eq!(a.answers[0].data, RData::Cname(name("example.com")));
    assert_eq!(a.chase, Some(name("example.com")));
    let c = ask("ext.shop.svc.cluster.local", RecordType::CNAME);
    assert_eq!(c.chase, None);
    assert_eq!(c.answers.len(), 1);
    // Nothing exists below an ExternalName.
    let below = ask("_http._tcp.ext.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(below.rcode, Rcode::NXDOMAIN);
}

#[test]
fn an_external_name_inside_the_zone_is_followed_locally() {
    let a = ask("alias.shop.svc.cluster.local", RecordType::A);
    assert_eq!(a.chase, None);
    assert_eq!(
        a.answers[0].data,
        RData::Cname(name("web.shop.svc.cluster.local"))
    );
    assert_eq!(a.answers[1].name, name("web.shop.svc.cluster.local"));
    assert_eq!(ips(&a.answers), [ip("10.96.0.20")]);
}

#[test]
fn external_names_naming_each_other_end_after_a_bounded_chain() {
    let mut c = catalog();
    for (n, target) in [("a", "b"), ("b", "a")] {
        c.apply_service(service(
            json!({"metadata": {"name": n, "namespace": "loop"},
            "spec": {"type": "ExternalName",
                     "externalName": format!("{target}.loop.svc.cluster.local")}}),
        ));
    }
    let snap = c.snapshot().unwrap();
    let Lookup::Answer(a) =
        zone().lookup(&snap, &question("a.loop.svc.cluster.local", RecordType::A))
    else {
        panic!("not local");
    };
    assert!(a.answers.len() <= 10, "{}", a.answers.len());
    assert!(a.answers.iter().all(|r| r.rtype() == RecordType::CNAME));
}

#[test]
fn pod_names_resolve_to_the_address_they_spell() {
    let a = ask("10-88-0-7.shop.pod.cluster.local", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.88.0.7")]);
    let a = ask("fd00--7.any-ns.pod.cluster.local", RecordType::AAAA);
    assert_eq!(ips(&a.answers), [ip("fd00::7")]);
    assert!(is_nodata(&ask(
        "10-88-0-7.shop.pod.cluster.local",
        RecordType::AAAA
    )));
    assert_eq!(
        ask("10-88-0.shop.pod.cluster.local", RecordType::A).rcode,
        Rcode::NXDOMAIN
    );
    assert_eq!(
        ask("nope.shop.pod.cluster.local", RecordType::A).rcode,
        Rcode::NXDOMAIN
    );
}

#[test]
fn ptr_queries_name_cluster_ips_and_headless_endpoints() {
    let a = ask("20.0.96.10.in-addr.arpa", RecordType::PTR);
    assert_eq!(a.answers.len(), 1);
    assert_eq!(
        a.answers[0].data,
        RData::Ptr(name("web.shop.svc.cluster.local"))
    );
    let a = ask("1.1.88.10.in-addr.arpa", RecordType::PTR);
    assert_eq!(
        a.answers[0].data,
        RData::Ptr(name("db-0.db.shop.svc.cluster.local"))
    );
    let a = ask("2.1.88.10.IN-ADDR.ARPA", RecordType::PTR);
    assert_eq!(
        a.answers[0].data,
        RData::Ptr(name("10-88-1-2.db.shop.svc.cluster.local"))
    );
    let v6 = "4.0.0.0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa";
    let a = ask(v6, RecordType::PTR);
    assert_eq!(
        a.answers[0].data,
        RData::Ptr(name("fd00--1-4.db.shop.svc.cluster.local"))
    );
}

#[test]
fn ptr_queries_for_unknown_addresses_are_forwarded() {
    let z = zone();
    let snap = snapshot();
    for n in [
        "9.9.9.9.in-addr.arpa",
        // Not-ready endpoints and non-headless backends are not named.
        "3.1.88.10.in-addr.arpa",
        "9.0.77.10.in-addr.arpa",
        "88.10.in-addr.arpa",
    ] {
        assert_eq!(
            z.lookup(&snap, &question(n, RecordType::PTR)),
            Lookup::NotMine,
            "{n}"
        );
    }
}

#[test]
fn missing_cluster_names_are_nxdomain_with_the_zone_soa() {
    for n in [
        "nope.shop.svc.cluster.local",
        "web.nope.svc.cluster.local",
        "nope.svc.cluster.local",
        "www.google.com.shop.svc.cluster.local",
        "google.com.cluster.local",
        "a.b.c.d.e.f.svc.cluster.local",
    ] {
        let a = ask(n, RecordType::A);
        assert_eq!(a.rcode, Rcode::NXDOMAIN, "{n}");
        let [soa] = a.authority.as_slice() else {
            panic!("{n}: no SOA");
        };
        assert_eq!(soa.name, name("cluster.local"));
        let RData::Soa(s) = &soa.data else {
            panic!("not SOA");
        };
        assert_eq!(s.mname, name("ns.dns.cluster.local"));
        assert_eq!(s.rname, name("hostmaster.cluster.local"));
        assert_eq!((s.minimum, soa.ttl), (5, 5));
    }
}

#[test]
fn existing_names_without_the_asked_type_are_nodata() {
    for (n, t) in [
        ("cluster.local", RecordType::A),
        ("svc.cluster.local", RecordType::A),
        ("shop.svc.cluster.local", RecordType::A),
        ("_tcp.web.shop.svc.cluster.local", RecordType::SRV),
        ("web.shop.svc.cluster.local", RecordType::TXT),
        ("web.shop.svc.cluster.local", RecordType::CNAME),
        ("_http._tcp.web.shop.svc.cluster.local", RecordType::A),
        ("pod.cluster.local", RecordType::A),
    ] {
        assert!(is_nodata(&ask(n, t)), "{n} {t}");
    }
    let soa = ask("cluster.local", RecordType::SOA);
    assert_eq!(soa.answers.len(), 1);
    assert_eq!(soa.answers[0].rtype(), RecordType::SOA);
}

#[test]
fn an_empty_catalog_has_no_svc_names() {
    let z = zone();
    let empty = Snapshot::default();
    let Lookup::Answer(a) = z.lookup(&empty, &question("svc.cluster.local", RecordType::A)) else {
        panic!("not local");
    };
    assert_eq!(a.rcode, Rcode::NXDOMAIN);
}

#[test]
fn names_are_matched_ignoring_case_and_answers_keep_the_asked_spelling() {
    let a = ask("WEB.Shop.SVC.Cluster.Local", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.96.0.20")]);
    assert_eq!(a.answers[0].name.to_string(), "WEB.Shop.SVC.Cluster.Local.");
    let a = ask("DB-0.DB.shop.svc.cluster.local", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.88.1.1")]);
}

#[test]
fn names_outside_the_cluster_domain_are_not_mine() {
    let z = zone();
    let snap = snapshot();
    for n in [
        "example.com",
        "local",
        "cluster.local.example.com",
        "xcluster.local",
    ] {
        assert_eq!(
            z.lookup(&snap, &question(n, RecordType::A)),
            Lookup::NotMine,
            "{n}"
        );
    }
}

#[test]
fn the_domain_and_ttl_are_configurable() {
    let z = Zone::new("Edge.Example", 30).unwrap();
    let Lookup::Answer(a) = z.lookup(
        &snapshot(),
        &question("web.shop.svc.edge.example", RecordType::A),
    ) else {
        panic!("not local");
    };
    assert_eq!(a.answers[0].ttl, 30);
    assert_eq!(
        z.lookup(
            &snapshot(),
            &question("web.shop.svc.cluster.local", RecordType::A)
        ),
        Lookup::NotMine
    );
    assert!(Zone::new(".", 5).is_err());
    assert!(Zone::new("a..b", 5).is_err());
}

#[test]
fn classes_other_than_in_are_refused_in_the_zone() {
    let mut q = question("web.shop.svc.cluster.local", RecordType::A);
    q.qclass = Class::CH;
    let Lookup::Answer(a) = zone().lookup(&snapshot(), &q) else {
        panic!("not local");
    };
    assert_eq!(a.rcode, Rcode::REFUSED);
}

#[test]
fn a_huge_headless_service_answers_a_bounded_random_sample() {
    let snap = big_snapshot(10_000);
    let z = zone();
    let q = question("big.shop.svc.cluster.local", RecordType::A);
    let Lookup::Answer(a) = z.lookup(&snap, &q) else {
        panic!("not local");
    };
    assert_eq!(a.answers.len(), crate::dns::zone::MAX_RECORDS);
    let Lookup::Answer(b) = z.lookup(&snap, &q) else {
        panic!("not local");
    };
    assert_ne!(
        ips(&a.answers),
        ips(&b.answers),
        "a different sample each time"
    );
}

#[test]
fn addresses_and_reverse_names_parse_only_when_whole() {
    assert_eq!(dashed(ip("10.0.0.1")), "10-0-0-1");
    assert_eq!(dashed(ip("fd00::1")), "fd00--1");
    assert_eq!(undash("10-0-0-1"), Some(ip("10.0.0.1")));
    assert_eq!(undash("fd00--1"), Some(ip("fd00::1")));
    for bad in ["10-0-0", "10.0.0.1", "01-0-0-1", "x", "", "1-2-3-4-5"] {
        assert_eq!(undash(bad), None, "{bad}");
    }
    assert_eq!(
        reverse_ip(&name("4.3.2.1.in-addr.arpa")),
        Some(ip("1.2.3.4"))
    );
    for bad in [
        "3.2.1.in-addr.arpa",
        "256.3.2.1.in-addr.arpa",
        "04.3.2.1.in-addr.arpa",
        "x.3.2.1.in-addr.arpa",
        "4.3.2.1.in-addr.example",
        "1.ip6.arpa",
    ] {
        assert_eq!(reverse_ip(&name(bad)), None, "{bad}");
    }
}
