//! The MQTT topics devicetwin reads and writes (devices reference §3.1, §4.5). A device ID
//! may be `<name>` (KubeEdge ≤ 1.16) or `<namespace>/<name>` (1.17+): the ID is what lies
//! between the prefix and a known suffix, so IDs that occur elsewhere in the topic (KubeEdge
//! cuts at their first occurrence) are read correctly.

pub const DEVICE_PREFIX: &str = "$hw/events/device/";
pub const NODE_PREFIX: &str = "$hw/events/node/";

/// What a topic asks devicetwin for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    TwinUpdate(String),
    TwinGet(String),
    TwinCloudUpdated(String),
    StateUpdate(String),
    StateGet(String),
    AttributesUpdated(String),
    MembershipGet(String),
    MembershipUpdated(String),
    MembershipDetailResult(String),
}

/// A topic suffix and the request it makes.
type Route = (&'static str, fn(String) -> Request);

pub fn classify(topic: &str) -> Option<Request> {
    if let Some(rest) = topic.strip_prefix(DEVICE_PREFIX) {
        let device: [Route; 6] = [
            ("/twin/update", Request::TwinUpdate),
            ("/twin/get", Request::TwinGet),
            ("/twin/cloud_updated", Request::TwinCloudUpdated),
            ("/state/update", Request::StateUpdate),
            ("/state/get", Request::StateGet),
            ("/updated", Request::AttributesUpdated),
        ];
        for (suffix, make) in device {
            if let Some(id) = rest.strip_suffix(suffix)
                && valid_id(id)
            {
                return Some(make(id.to_string()));
            }
        }
        return None;
    }
    let rest = topic.strip_prefix(NODE_PREFIX)?;
    let node: [Route; 3] = [
        ("/membership/get", Request::MembershipGet),
        ("/membership/updated", Request::MembershipUpdated),
        ("/membership/detail/result", Request::MembershipDetailResult),
    ];
    for (suffix, make) in node {
        if let Some(n) = rest.strip_suffix(suffix)
            && !n.is_empty()
            && !n.contains('/')
        {
            return Some(make(n.to_string()));
        }
    }
    None
}

fn valid_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split('/').collect();
    (1..=2).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && !p.contains(['+', '#']))
}

pub fn device(id: &str, suffix: &str) -> String {
    format!("{DEVICE_PREFIX}{id}/{suffix}")
}

pub fn node(node: &str, suffix: &str) -> String {
    format!("{NODE_PREFIX}{node}/{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_their_device_in_either_form() {
        assert_eq!(
            classify("$hw/events/device/thermo-1/twin/update"),
            Some(Request::TwinUpdate("thermo-1".into()))
        );
        assert_eq!(
            classify("$hw/events/device/default/thermo-1/state/update"),
            Some(Request::StateUpdate("default/thermo-1".into()))
        );
        // KubeEdge misreads IDs that occur earlier in the topic; these are fine here.
        assert_eq!(
            classify("$hw/events/device/device/twin/get"),
            Some(Request::TwinGet("device".into()))
        );
        assert_eq!(
            classify("$hw/events/node/edge-1/membership/get"),
            Some(Request::MembershipGet("edge-1".into()))
        );
        for bad in [
            "$hw/events/device//twin/update",
            "$hw/events/device/a/b/c/twin/update",
            "$hw/events/device/x/twin/frob",
            "$hw/events/upload/x",
            "$hw/events/node/a/b/membership/get",
        ] {
            assert_eq!(classify(bad), None, "{bad}");
        }
        assert_eq!(
            device("t1", "twin/update/result"),
            "$hw/events/device/t1/twin/update/result"
        );
    }
}
