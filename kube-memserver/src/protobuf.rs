//! Decoding of `application/vnd.kubernetes.protobuf` request bodies for the kinds kubectl's
//! typed clients send that way (`kubectl create configmap|secret|namespace|serviceaccount|token|
//! deployment|job`, and `kubectl certificate approve|deny`'s CertificateSigningRequest).
//! Responses are always JSON, which those clients accept.
//!
//! The envelope is `k8s\0` + `runtime.Unknown{typeMeta, raw}`; `raw` is the object's protobuf
//! encoding, decoded here with small per-type field tables.

use base64::Engine;
use serde_json::{Map, Value, json};

const MAGIC: &[u8] = b"k8s\x00";

#[derive(Clone, Copy)]
enum F {
    Str,
    /// A non-pointer integer: Go always writes it, JSON omits zero.
    Int,
    /// A pointer integer: present means set, zero included.
    OptInt,
    /// A non-pointer bool (false omitted).
    Bool,
    /// A pointer bool (false kept).
    OptBool,
    /// `intstr.IntOrString{type, intVal, strVal}`.
    IntOrString,
    /// bytes rendered as base64 (Go `[]byte`).
    Bytes,
    Time,
    Msg(&'static [(u32, &'static str, F, bool)]),
    MapStrStr,
    MapStrBytes,
    /// `map<string, resource.Quantity>` (a Quantity is `{string: 1}`).
    MapStrQuantity,
}

type Schema = &'static [(u32, &'static str, F, bool)];

const OWNER_REF: Schema = &[
    (1, "kind", F::Str, false),
    (3, "name", F::Str, false),
    (4, "uid", F::Str, false),
    (5, "apiVersion", F::Str, false),
    (6, "controller", F::OptBool, false),
    (7, "blockOwnerDeletion", F::OptBool, false),
];
const OBJECT_META: Schema = &[
    (1, "name", F::Str, false),
    (2, "generateName", F::Str, false),
    (3, "namespace", F::Str, false),
    (5, "uid", F::Str, false),
    (6, "resourceVersion", F::Str, false),
    (7, "generation", F::Int, false),
    (8, "creationTimestamp", F::Time, false),
    (9, "deletionTimestamp", F::Time, false),
    (10, "deletionGracePeriodSeconds", F::OptInt, false),
    (11, "labels", F::MapStrStr, false),
    (12, "annotations", F::MapStrStr, false),
    (13, "ownerReferences", F::Msg(OWNER_REF), true),
    (14, "finalizers", F::Str, true),
];
const CONFIG_MAP: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "data", F::MapStrStr, false),
    (3, "binaryData", F::MapStrBytes, false),
    (4, "immutable", F::OptBool, false),
];
const SECRET: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "data", F::MapStrBytes, false),
    (3, "type", F::Str, false),
    (4, "stringData", F::MapStrStr, false),
    (5, "immutable", F::OptBool, false),
];
const NAMESPACE_SPEC: Schema = &[(1, "finalizers", F::Str, true)];
const NAMESPACE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "spec", F::Msg(NAMESPACE_SPEC), false),
];
const OBJECT_REF: Schema = &[
    (1, "kind", F::Str, false),
    (2, "namespace", F::Str, false),
    (3, "name", F::Str, false),
    (4, "uid", F::Str, false),
    (5, "apiVersion", F::Str, false),
    (6, "resourceVersion", F::Str, false),
    (7, "fieldPath", F::Str, false),
];
const LOCAL_REF: Schema = &[(1, "name", F::Str, false)];
const SERVICE_ACCOUNT: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "secrets", F::Msg(OBJECT_REF), true),
    (3, "imagePullSecrets", F::Msg(LOCAL_REF), true),
    (4, "automountServiceAccountToken", F::OptBool, false),
];
const BOUND_REF: Schema = &[
    (1, "kind", F::Str, false),
    (2, "apiVersion", F::Str, false),
    (3, "name", F::Str, false),
    (4, "uid", F::Str, false),
];
const TOKEN_REQUEST_SPEC: Schema = &[
    (1, "audiences", F::Str, true),
    (3, "boundObjectRef", F::Msg(BOUND_REF), false),
    (4, "expirationSeconds", F::OptInt, false),
];
const TOKEN_REQUEST: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "spec", F::Msg(TOKEN_REQUEST_SPEC), false),
];
const PRECONDITIONS: Schema = &[
    (1, "uid", F::Str, false),
    (2, "resourceVersion", F::Str, false),
];
const DELETE_OPTIONS: Schema = &[
    (1, "gracePeriodSeconds", F::OptInt, false),
    (2, "preconditions", F::Msg(PRECONDITIONS), false),
    (3, "orphanDependents", F::OptBool, false),
    (4, "propagationPolicy", F::Str, false),
    (5, "dryRun", F::Str, true),
];
const POLICY_RULE: Schema = &[
    (1, "verbs", F::Str, true),
    (2, "apiGroups", F::Str, true),
    (3, "resources", F::Str, true),
    (4, "resourceNames", F::Str, true),
    (5, "nonResourceURLs", F::Str, true),
];
const LABEL_SELECTOR_REQ: Schema = &[
    (1, "key", F::Str, false),
    (2, "operator", F::Str, false),
    (3, "values", F::Str, true),
];
const LABEL_SELECTOR: Schema = &[
    (1, "matchLabels", F::MapStrStr, false),
    (2, "matchExpressions", F::Msg(LABEL_SELECTOR_REQ), true),
];
const AGGREGATION_RULE: Schema = &[(1, "clusterRoleSelectors", F::Msg(LABEL_SELECTOR), true)];
const ROLE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "rules", F::Msg(POLICY_RULE), true),
];
const CLUSTER_ROLE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "rules", F::Msg(POLICY_RULE), true),
    (3, "aggregationRule", F::Msg(AGGREGATION_RULE), false),
];
const SUBJECT: Schema = &[
    (1, "kind", F::Str, false),
    (2, "apiGroup", F::Str, false),
    (3, "name", F::Str, false),
    (4, "namespace", F::Str, false),
];
const ROLE_REF: Schema = &[
    (1, "apiGroup", F::Str, false),
    (2, "kind", F::Str, false),
    (3, "name", F::Str, false),
];
const ROLE_BINDING: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "subjects", F::Msg(SUBJECT), true),
    (3, "roleRef", F::Msg(ROLE_REF), false),
];
const SERVICE_PORT: Schema = &[
    (1, "name", F::Str, false),
    (2, "protocol", F::Str, false),
    (3, "port", F::Int, false),
    (4, "targetPort", F::IntOrString, false),
    (5, "nodePort", F::Int, false),
    (6, "appProtocol", F::Str, false),
];
const SERVICE_SPEC: Schema = &[
    (1, "ports", F::Msg(SERVICE_PORT), true),
    (2, "selector", F::MapStrStr, false),
    (3, "clusterIP", F::Str, false),
    (4, "type", F::Str, false),
    (5, "externalIPs", F::Str, true),
    (7, "sessionAffinity", F::Str, false),
    (8, "loadBalancerIP", F::Str, false),
    (9, "loadBalancerSourceRanges", F::Str, true),
    (10, "externalName", F::Str, false),
    (11, "externalTrafficPolicy", F::Str, false),
    (12, "healthCheckNodePort", F::Int, false),
    (13, "publishNotReadyAddresses", F::Bool, false),
    (17, "ipFamilyPolicy", F::Str, false),
    (18, "clusterIPs", F::Str, true),
    (19, "ipFamilies", F::Str, true),
    (20, "allocateLoadBalancerNodePorts", F::OptBool, false),
    (21, "loadBalancerClass", F::Str, false),
    (22, "internalTrafficPolicy", F::Str, false),
];
const SERVICE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "spec", F::Msg(SERVICE_SPEC), false),
];
const EMPTY: Schema = &[];
const CONTAINER_PORT: Schema = &[
    (1, "name", F::Str, false),
    (2, "hostPort", F::Int, false),
    (3, "containerPort", F::Int, false),
    (4, "protocol", F::Str, false),
    (5, "hostIP", F::Str, false),
];
const ENV_VAR: Schema = &[(1, "name", F::Str, false), (2, "value", F::Str, false)];
const RESOURCES: Schema = &[
    (1, "limits", F::MapStrQuantity, false),
    (2, "requests", F::MapStrQuantity, false),
];
const CONTAINER: Schema = &[
    (1, "name", F::Str, false),
    (2, "image", F::Str, false),
    (3, "command", F::Str, true),
    (4, "args", F::Str, true),
    (5, "workingDir", F::Str, false),
    (6, "ports", F::Msg(CONTAINER_PORT), true),
    (7, "env", F::Msg(ENV_VAR), true),
    (8, "resources", F::Msg(RESOURCES), false),
    (13, "terminationMessagePath", F::Str, false),
    (14, "imagePullPolicy", F::Str, false),
    (16, "stdin", F::Bool, false),
    (17, "stdinOnce", F::Bool, false),
    (18, "tty", F::Bool, false),
    (20, "terminationMessagePolicy", F::Str, false),
];
const TOLERATION: Schema = &[
    (1, "key", F::Str, false),
    (2, "operator", F::Str, false),
    (3, "value", F::Str, false),
    (4, "effect", F::Str, false),
    (5, "tolerationSeconds", F::OptInt, false),
];
const POD_SPEC: Schema = &[
    (2, "containers", F::Msg(CONTAINER), true),
    (3, "restartPolicy", F::Str, false),
    (4, "terminationGracePeriodSeconds", F::OptInt, false),
    (5, "activeDeadlineSeconds", F::OptInt, false),
    (6, "dnsPolicy", F::Str, false),
    (7, "nodeSelector", F::MapStrStr, false),
    (8, "serviceAccountName", F::Str, false),
    (10, "nodeName", F::Str, false),
    (11, "hostNetwork", F::Bool, false),
    (14, "securityContext", F::Msg(EMPTY), false),
    (16, "hostname", F::Str, false),
    (17, "subdomain", F::Str, false),
    (19, "schedulerName", F::Str, false),
    (20, "initContainers", F::Msg(CONTAINER), true),
    (22, "tolerations", F::Msg(TOLERATION), true),
    (24, "priorityClassName", F::Str, false),
    (25, "priority", F::OptInt, false),
];
const POD_TEMPLATE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "spec", F::Msg(POD_SPEC), false),
];
const ROLLING_UPDATE_DEPLOYMENT: Schema = &[
    (1, "maxUnavailable", F::IntOrString, false),
    (2, "maxSurge", F::IntOrString, false),
];
const DEPLOYMENT_STRATEGY: Schema = &[
    (1, "type", F::Str, false),
    (2, "rollingUpdate", F::Msg(ROLLING_UPDATE_DEPLOYMENT), false),
];
const DEPLOYMENT_SPEC: Schema = &[
    (1, "replicas", F::OptInt, false),
    (2, "selector", F::Msg(LABEL_SELECTOR), false),
    (3, "template", F::Msg(POD_TEMPLATE), false),
    (4, "strategy", F::Msg(DEPLOYMENT_STRATEGY), false),
    (5, "minReadySeconds", F::Int, false),
    (6, "revisionHistoryLimit", F::OptInt, false),
    (7, "paused", F::Bool, false),
    (9, "progressDeadlineSeconds", F::OptInt, false),
];
const DEPLOYMENT: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "spec", F::Msg(DEPLOYMENT_SPEC), false),
];
const JOB_SPEC: Schema = &[
    (1, "parallelism", F::OptInt, false),
    (2, "completions", F::OptInt, false),
    (3, "activeDeadlineSeconds", F::OptInt, false),
    (4, "selector", F::Msg(LABEL_SELECTOR), false),
    (5, "manualSelector", F::OptBool, false),
    (6, "template", F::Msg(POD_TEMPLATE), false),
    (7, "backoffLimit", F::OptInt, false),
    (8, "ttlSecondsAfterFinished", F::OptInt, false),
    (9, "completionMode", F::Str, false),
    (10, "suspend", F::OptBool, false),
];
const JOB: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "spec", F::Msg(JOB_SPEC), false),
];
const CSR_SPEC: Schema = &[
    (1, "request", F::Bytes, false),
    (2, "username", F::Str, false),
    (3, "uid", F::Str, false),
    (4, "groups", F::Str, true),
    (5, "usages", F::Str, true),
    (7, "signerName", F::Str, false),
    (8, "expirationSeconds", F::OptInt, false),
];
const CSR_CONDITION: Schema = &[
    (1, "type", F::Str, false),
    (2, "reason", F::Str, false),
    (3, "message", F::Str, false),
    (4, "lastUpdateTime", F::Time, false),
    (5, "lastTransitionTime", F::Time, false),
    (6, "status", F::Str, false),
];
const CSR_STATUS: Schema = &[
    (1, "conditions", F::Msg(CSR_CONDITION), true),
    (2, "certificate", F::Bytes, false),
];
/// `spec.extra` (a map of string lists) is not decoded: the server sets it on create and keeps
/// it on every update.
const CSR: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META), false),
    (2, "spec", F::Msg(CSR_SPEC), false),
    (3, "status", F::Msg(CSR_STATUS), false),
];
const TYPE_META: Schema = &[(1, "apiVersion", F::Str, false), (2, "kind", F::Str, false)];
const UNKNOWN: Schema = &[
    (1, "typeMeta", F::Msg(TYPE_META), false),
    (2, "raw", F::Bytes, false),
];

fn schema_for(kind: &str) -> Option<Schema> {
    Some(match kind {
        "ConfigMap" => CONFIG_MAP,
        "Secret" => SECRET,
        "Namespace" => NAMESPACE,
        "ServiceAccount" => SERVICE_ACCOUNT,
        "TokenRequest" => TOKEN_REQUEST,
        "DeleteOptions" => DELETE_OPTIONS,
        "Role" => ROLE,
        "ClusterRole" => CLUSTER_ROLE,
        "RoleBinding" | "ClusterRoleBinding" => ROLE_BINDING,
        "Service" => SERVICE,
        "Deployment" => DEPLOYMENT,
        "Job" => JOB,
        "CertificateSigningRequest" => CSR,
        _ => return None,
    })
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err("varint too long".into())
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
        let end = self.pos.checked_add(len).ok_or("length overflow")?;
        let s = self.buf.get(self.pos..end).ok_or("truncated field")?;
        self.pos = end;
        Ok(s)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => {
                self.pos += 8;
                Ok(())
            }
            2 => self.bytes().map(|_| ()),
            5 => {
                self.pos += 4;
                Ok(())
            }
            w => Err(format!("unsupported wire type {w}")),
        }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8 in string field".to_string())
}

/// Go writes zero values of non-pointer fields; JSON would omit them (`omitempty`).
fn decode_time(b: &[u8]) -> Result<Value, String> {
    let mut r = Reader { buf: b, pos: 0 };
    let (mut secs, mut nanos) = (0i64, 0i64);
    while !r.done() {
        let key = r.varint()?;
        match (key >> 3, key & 7) {
            (1, 0) => secs = r.varint()? as i64,
            (2, 0) => nanos = r.varint()? as i64,
            (_, w) => r.skip(w)?,
        }
    }
    if secs == 0 && nanos == 0 {
        return Ok(Value::Null);
    }
    let t = time::OffsetDateTime::from_unix_timestamp(secs)
        .map_err(|e| e.to_string())?
        .checked_add(time::Duration::nanoseconds(nanos))
        .ok_or("timestamp out of range")?;
    Ok(json!(super::meta::format_time(t)))
}

fn decode_int_or_string(b: &[u8]) -> Result<Value, String> {
    let mut r = Reader { buf: b, pos: 0 };
    let (mut ty, mut int, mut string) = (0u64, 0i64, String::new());
    while !r.done() {
        let key = r.varint()?;
        match (key >> 3, key & 7) {
            (1, 0) => ty = r.varint()?,
            (2, 0) => int = r.varint()? as i64,
            (3, 2) => string = utf8(r.bytes()?)?,
            (_, w) => r.skip(w)?,
        }
    }
    Ok(if ty == 1 { json!(string) } else { json!(int) })
}

fn decode_map_entry(b: &[u8]) -> Result<(String, &[u8]), String> {
    let mut r = Reader { buf: b, pos: 0 };
    let (mut k, mut v): (String, &[u8]) = (String::new(), &[]);
    while !r.done() {
        let key = r.varint()?;
        match (key >> 3, key & 7) {
            (1, 2) => k = utf8(r.bytes()?)?,
            (2, 2) => v = r.bytes()?,
            (_, w) => r.skip(w)?,
        }
    }
    Ok((k, v))
}

fn decode_msg(b: &[u8], schema: Schema) -> Result<Value, String> {
    let mut r = Reader { buf: b, pos: 0 };
    let mut out = Map::new();
    while !r.done() {
        let key = r.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        let Some((_, name, ty, repeated)) = schema.iter().find(|(n, ..)| u64::from(*n) == num)
        else {
            r.skip(wire)?;
            continue;
        };
        let value = match (ty, wire) {
            (F::Str, 2) => json!(utf8(r.bytes()?)?),
            (F::Int, 0) => match r.varint()? as i64 {
                0 => continue,
                n => json!(n),
            },
            (F::OptInt, 0) => json!(r.varint()? as i64),
            (F::Bool, 0) => match r.varint()? {
                0 => continue,
                _ => json!(true),
            },
            (F::OptBool, 0) => json!(r.varint()? != 0),
            (F::IntOrString, 2) => decode_int_or_string(r.bytes()?)?,
            (F::Bytes, 2) => json!(base64::engine::general_purpose::STANDARD.encode(r.bytes()?)),
            (F::Time, 2) => decode_time(r.bytes()?)?,
            (F::Msg(s), 2) => decode_msg(r.bytes()?, s)?,
            (F::MapStrStr, 2) => {
                let (k, v) = decode_map_entry(r.bytes()?)?;
                let entry = out.entry(name.to_string()).or_insert_with(|| json!({}));
                entry[k] = json!(utf8(v)?);
                continue;
            }
            (F::MapStrQuantity, 2) => {
                let (k, v) = decode_map_entry(r.bytes()?)?;
                let q = decode_msg(v, &[(1, "string", F::Str, false)])?;
                let entry = out.entry(name.to_string()).or_insert_with(|| json!({}));
                entry[k] = q["string"].clone();
                continue;
            }
            (F::MapStrBytes, 2) => {
                let (k, v) = decode_map_entry(r.bytes()?)?;
                let entry = out.entry(name.to_string()).or_insert_with(|| json!({}));
                entry[k] = json!(base64::engine::general_purpose::STANDARD.encode(v));
                continue;
            }
            (_, w) => {
                r.skip(w)?;
                continue;
            }
        };
        let zero = value.is_null() || value.as_str() == Some("");
        if zero && !*repeated {
            continue;
        }
        if *repeated {
            match out.entry(name.to_string()).or_insert_with(|| json!([])) {
                Value::Array(a) => a.push(value),
                other => *other = json!([value]),
            }
        } else {
            out.insert(name.to_string(), value);
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf request body into the JSON object it stands for.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or("missing k8s protobuf envelope")?;
    let unknown = decode_msg(rest, UNKNOWN)?;
    let kind = unknown["typeMeta"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api_version = unknown["typeMeta"]["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let schema = schema_for(&kind)
        .ok_or_else(|| format!("protobuf bodies for kind {kind:?} are not supported; send JSON"))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(unknown["raw"].as_str().unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let mut obj = decode_msg(&raw, schema)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((num << 3) | 2) as u8, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_a_config_map_envelope() {
        let meta = field(1, b"cfg");
        let entry = [field(1, b"k"), field(2, b"v")].concat();
        let raw = [field(1, &meta), field(2, &entry)].concat();
        let tm = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &tm), field(2, &raw)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(obj["kind"], "ConfigMap");
        assert_eq!(obj["metadata"]["name"], "cfg");
        assert_eq!(obj["data"]["k"], "v");
        assert!(decode(b"k8s\x00\xff").is_err());
        // DeleteOptions{gracePeriodSeconds: 0} keeps the explicit zero (a pointer field).
        let tm = [field(1, b"v1"), field(2, b"DeleteOptions")].concat();
        let raw = vec![1 << 3, 0];
        let body = [MAGIC.to_vec(), field(1, &tm), field(2, &raw)].concat();
        assert_eq!(decode(&body).unwrap()["gracePeriodSeconds"], 0);
        assert!(decode(b"nope").is_err());
    }

    #[test]
    fn decodes_a_certificate_signing_request_with_conditions() {
        let cond = [
            field(1, b"Approved"),
            field(2, b"KubectlApprove"),
            field(6, b"True"),
        ]
        .concat();
        let spec = [
            field(1, b"pem"),
            field(5, b"server auth"),
            field(5, b"digital signature"),
            field(7, b"kubernetes.io/kubelet-serving"),
        ]
        .concat();
        let raw = [
            field(1, &field(1, b"c1")),
            field(2, &spec),
            field(3, &field(1, &cond)),
        ]
        .concat();
        let tm = [
            field(1, b"certificates.k8s.io/v1"),
            field(2, b"CertificateSigningRequest"),
        ]
        .concat();
        let obj = decode(&[MAGIC.to_vec(), field(1, &tm), field(2, &raw)].concat()).unwrap();
        assert_eq!(obj["metadata"]["name"], "c1");
        assert_eq!(obj["spec"]["request"], "cGVt");
        assert_eq!(
            obj["spec"]["usages"],
            json!(["server auth", "digital signature"])
        );
        assert_eq!(
            obj["status"]["conditions"],
            json!([{"type": "Approved", "reason": "KubectlApprove", "status": "True"}])
        );
    }
}
