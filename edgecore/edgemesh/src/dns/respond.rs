//! One query in, one reply out: validation, the zone or the upstreams, the size limit.
//!
//! [`Responder::handle`] is synchronous and answers what it can at once (zone answers,
//! errors); a query for the upstreams comes back as a [`Pending`] holding a forward slot,
//! for the server to run in a task of its own so that one slow upstream never holds up the
//! socket's other clients.
//!
//! | input                                   | reply                                  |
//! |-----------------------------------------|----------------------------------------|
//! | shorter than a header, or a response    | none                                   |
//! | opcode other than QUERY                 | NOTIMP                                 |
//! | not exactly one question, malformed     | FORMERR (header only, with the ID)     |
//! | EDNS version other than 0               | BADVERS                                |
//! | a cluster name                          | the zone's answer                      |
//! | any other name                          | the upstream's; SERVFAIL if none; REFUSED when too many wait |

use super::forward::{ForwardError, ForwardSlot, Forwarder, MAX_UDP_REPLY};
use super::metrics::{DnsMetrics, QueryResult, Transport};
use super::name::Name;
use super::wire::{
    self, Class, Edns, Header, MAX_MESSAGE_LEN, MIN_UDP_LIMIT, Message, Opcode, Question, RData,
    Rcode,
};
use super::zone::{Lookup, Zone, ZoneAnswer};
use crate::catalog::Snapshot;
use std::sync::Arc;
use std::time::Instant;

pub(crate) struct Responder {
    zone: Zone,
    forwarder: Arc<Forwarder>,
    metrics: DnsMetrics,
}

pub(crate) enum Step {
    Reply(Vec<u8>),
    /// Nothing to send.
    Drop,
    /// Waits for an upstream: run it, then send its reply.
    Wait(Box<Pending>),
}

/// A query as far as the reply needs it.
struct Request {
    header: Header,
    question: Question,
    edns: Option<Edns>,
    transport: Transport,
    /// The most the reply may take: 65535 over TCP; over UDP 512, or the client's EDNS
    /// payload size up to 4096.
    limit: usize,
    started: Instant,
}

impl Request {
    /// A reply echoing the question (in the asker's case) and EDNS0.
    fn reply(&self, rcode: Rcode) -> Message {
        Message {
            header: Header {
                id: self.header.id,
                response: true,
                opcode: self.header.opcode,
                recursion_desired: self.header.recursion_desired,
                recursion_available: true,
                checking_disabled: self.header.checking_disabled,
                ..Header::default()
            },
            rcode,
            questions: vec![self.question.clone()],
            edns: self.edns.as_ref().map(|e| Edns {
                udp_payload: MAX_UDP_REPLY as u16,
                version: 0,
                // RFC 3225 §3: copied from the query.
                dnssec_ok: e.dnssec_ok,
                options: Vec::new(),
            }),
            ..Message::default()
        }
    }
}

/// A query waiting for the upstreams.
pub(crate) struct Pending {
    request: Request,
    work: Work,
    slot: ForwardSlot,
    forwarder: Arc<Forwarder>,
    metrics: DnsMetrics,
}

enum Work {
    /// The client's query, passed on as it came.
    Forward(Vec<u8>),
    /// The zone's answer ends in a CNAME to this name outside the zone.
    Chase(ZoneAnswer, Name),
}

impl Responder {
    pub(crate) fn new(zone: Zone, forwarder: Arc<Forwarder>, metrics: DnsMetrics) -> Responder {
        Responder {
            zone,
            forwarder,
            metrics,
        }
    }

    pub(crate) fn handle(
        &self,
        packet: &[u8],
        transport: Transport,
        snap: &Snapshot,
        started: Instant,
    ) -> Step {
        let count = |result| self.metrics.query(result, transport, started.elapsed());
        let Ok((header, _, counts)) = wire::decode_header(packet) else {
            count(QueryResult::Dropped);
            return Step::Drop;
        };
        if header.response {
            count(QueryResult::Dropped);
            return Step::Drop;
        }
        let bare = |rcode: Rcode, result| {
            count(result);
            Step::Reply(bare_reply(&header, rcode))
        };
        if header.opcode != Opcode::QUERY {
            return bare(Rcode::NOTIMP, QueryResult::NotImp);
        }
        if counts.questions != 1 {
            return bare(Rcode::FORMERR, QueryResult::FormErr);
        }
        let msg = match Message::decode(packet) {
            Ok(msg) => msg,
            Err(error) => {
                tracing::debug!(%error, "malformed DNS query");
                return bare(Rcode::FORMERR, QueryResult::FormErr);
            }
        };
        let Some(question) = msg.questions.into_iter().next() else {
            return bare(Rcode::FORMERR, QueryResult::FormErr);
        };
        let limit = match transport {
            Transport::Tcp => MAX_MESSAGE_LEN,
            Transport::Udp => msg.edns.as_ref().map_or(MIN_UDP_LIMIT, |e| {
                usize::from(e.udp_payload).clamp(MIN_UDP_LIMIT, MAX_UDP_REPLY)
            }),
        };
        let request = Request {
            header,
            question,
            edns: msg.edns,
            transport,
            limit,
            started,
        };
        if request.edns.as_ref().is_some_and(|e| e.version != 0) {
            let reply = request.reply(Rcode::BADVERS);
            return Step::Reply(finish(
                &self.metrics,
                &request,
                &reply,
                QueryResult::FormErr,
            ));
        }
        let lookup = self.zone.lookup(snap, &request.question);
        let reserve = || self.forwarder.reserve();
        match lookup {
            Lookup::Answer(mut answer) => match answer.chase.take().map(|t| (t, reserve())) {
                Some((target, Ok(slot))) => self.wait(request, Work::Chase(answer, target), slot),
                // Without an upstream, the CNAME alone is still a true (partial) answer.
                _ => Step::Reply(local(&self.metrics, &request, answer, true)),
            },
            Lookup::NotMine => match reserve() {
                Ok(slot) => self.wait(request, Work::Forward(packet.to_vec()), slot),
                Err(ForwardError::Busy) => {
                    let reply = request.reply(Rcode::REFUSED);
                    Step::Reply(finish(
                        &self.metrics,
                        &request,
                        &reply,
                        QueryResult::Refused,
                    ))
                }
                Err(ForwardError::NoUpstream | ForwardError::Failed) => {
                    let reply = request.reply(Rcode::SERVFAIL);
                    Step::Reply(finish(
                        &self.metrics,
                        &request,
                        &reply,
                        QueryResult::ServFail,
                    ))
                }
            },
        }
    }

    fn wait(&self, request: Request, work: Work, slot: ForwardSlot) -> Step {
        Step::Wait(Box::new(Pending {
            request,
            work,
            slot,
            forwarder: self.forwarder.clone(),
            metrics: self.metrics.clone(),
        }))
    }
}

impl Pending {
    /// Asks the upstreams; always ends in a reply (SERVFAIL when none answers).
    pub(crate) async fn run(self) -> Vec<u8> {
        let Pending {
            request,
            work,
            slot,
            forwarder,
            metrics,
        } = self;
        match work {
            Work::Forward(packet) => {
                match forwarder.exchange(&slot, &packet, request.transport).await {
                    Ok(reply) if reply.len() <= request.limit => {
                        metrics.query(
                            QueryResult::Forwarded,
                            request.transport,
                            request.started.elapsed(),
                        );
                        reply
                    }
                    // Too long for the client's UDP limit: TC, so it asks again over TCP.
                    Ok(_) => {
                        let mut reply = request.reply(Rcode::NOERROR);
                        reply.header.truncated = true;
                        metrics.truncated(request.transport);
                        finish(&metrics, &request, &reply, QueryResult::Forwarded)
                    }
                    Err(_) => {
                        let reply = request.reply(Rcode::SERVFAIL);
                        finish(&metrics, &request, &reply, QueryResult::ServFail)
                    }
                }
            }
            Work::Chase(mut answer, target) => {
                let query = Message {
                    header: Header {
                        id: rand::random(),
                        recursion_desired: true,
                        ..Header::default()
                    },
                    questions: vec![Question {
                        name: target,
                        qtype: request.question.qtype,
                        qclass: Class::IN,
                    }],
                    edns: Some(Edns {
                        udp_payload: MAX_UDP_REPLY as u16,
                        version: 0,
                        dnssec_ok: false,
                        options: Vec::new(),
                    }),
                    ..Message::default()
                }
                .encode(MIN_UDP_LIMIT);
                let mut reply = forwarder.exchange(&slot, &query, Transport::Udp).await;
                if let Ok(r) = &reply
                    && wire::decode_header(r).is_ok_and(|(h, _, _)| h.truncated)
                {
                    reply = forwarder.exchange(&slot, &query, Transport::Tcp).await;
                }
                let upstream = reply.ok().and_then(|r| Message::decode(&r).ok());
                match upstream {
                    Some(up) if up.rcode == Rcode::NOERROR || up.rcode == Rcode::NXDOMAIN => {
                        // Only records whose data can be carried into another message.
                        answer.answers.extend(up.answers.into_iter().filter(|r| {
                            matches!(r.data, RData::A(_) | RData::Aaaa(_) | RData::Cname(_))
                        }));
                        answer.rcode = up.rcode;
                        local(&metrics, &request, answer, false)
                    }
                    _ => {
                        let reply = request.reply(Rcode::SERVFAIL);
                        finish(&metrics, &request, &reply, QueryResult::ServFail)
                    }
                }
            }
        }
    }
}

/// A reply with only a header: for queries whose question cannot be trusted.
fn bare_reply(query: &Header, rcode: Rcode) -> Vec<u8> {
    Message {
        header: Header {
            id: query.id,
            response: true,
            opcode: query.opcode,
            recursion_desired: query.recursion_desired,
            recursion_available: true,
            ..Header::default()
        },
        rcode,
        ..Message::default()
    }
    .encode(MIN_UDP_LIMIT)
}

/// Encodes the zone's answer (authoritative unless it carries upstream data).
fn local(
    metrics: &DnsMetrics,
    request: &Request,
    answer: ZoneAnswer,
    authoritative: bool,
) -> Vec<u8> {
    let result = match answer.rcode {
        _ if !authoritative => QueryResult::Forwarded,
        Rcode::NXDOMAIN => QueryResult::NxDomain,
        Rcode::REFUSED => QueryResult::Refused,
        _ => QueryResult::Local,
    };
    let mut reply = request.reply(answer.rcode);
    reply.header.authoritative = authoritative;
    reply.answers = answer.answers;
    reply.authority = answer.authority;
    reply.additional = answer.additional;
    finish(metrics, request, &reply, result)
}

/// Encodes within the request's limit and counts the query.
fn finish(
    metrics: &DnsMetrics,
    request: &Request,
    reply: &Message,
    result: QueryResult,
) -> Vec<u8> {
    let bytes = reply.encode(request.limit);
    let truncated = bytes.get(2).is_some_and(|flags| flags & 0x02 != 0);
    if truncated && !reply.header.truncated {
        metrics.truncated(request.transport);
    }
    metrics.query(result, request.transport, request.started.elapsed());
    bytes
}
