//! The downstream messages, as KubeEdge's policycontroller sends them: source
//! `policycontroller`, group `resource`, resource `<ns>/serviceaccountaccess/<name>` (cloudhub
//! adds nothing; KubeEdge's `node/<node>/` prefix never leaves its cloud), ACKed with the
//! object's resourceVersion.

use super::rbac::ObjKey;
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation, ResourcePath, ResourceType};
use serde_json::{Value, json};

/// The resource of the ServiceAccountAccess of service account `key`.
pub fn resource(key: &ObjKey) -> String {
    ResourcePath::new(
        Some(&key.0),
        ResourceType::ServiceAccountAccess.as_str(),
        Some(&key.1),
    )
    .to_wire()
}

fn message(op: Operation, key: &ObjKey, mut content: Value, rv: u64) -> Message {
    let rv = rv.to_string();
    if let Some(meta) = content.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), rv.clone().into());
    }
    Message::new(
        source::POLICY_CONTROLLER,
        Group::Resource,
        op,
        resource(key),
        content,
    )
    .with_resource_version(rv)
}

/// An insert or update of a computed object (`metadata.namespace/name` are the SA's).
pub fn object(op: Operation, obj: &Value, rv: u64) -> Message {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let key = (s("/metadata/namespace"), s("/metadata/name"));
    message(op, &key, obj.clone(), rv)
}

/// A delete of the object of service account `key` (uid: the one the edge was sent).
pub fn delete(key: &ObjKey, uid: &str, rv: u64) -> Message {
    let content = json!({
        "apiVersion": super::API_VERSION,
        "kind": super::KIND,
        "metadata": {"name": key.1, "namespace": key.0, "uid": uid},
    });
    message(Operation::Delete, key, content, rv)
}
