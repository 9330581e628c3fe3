//! Authorization of MetaServer requests (KubeEdge's `requireAuthorization`): Kubernetes' RBAC
//! authorizer evaluated over the `ServiceAccountAccess` objects the cloud's policy controller
//! sends to this edge (devices reference §6.2). Each object carries the RoleBindings and
//! ClusterRoleBindings that name one service account, with the rules of the roles they
//! reference (`spec.accessRoleBinding[].{roleBinding,rules}`,
//! `spec.accessClusterRoleBinding[].{clusterRoleBinding,rules}`).
//!
//! As kube-apiserver's RBAC authorizer: ClusterRoleBinding rules apply everywhere,
//! RoleBinding rules only to resource requests in the binding's namespace; a binding applies
//! when one of its subjects names the user (User), one of its groups (Group) or, for a
//! ServiceAccount subject (namespace defaulting to the binding's), the user
//! `system:serviceaccount:<ns>:<name>`. Nothing here panics on stored input: malformed parts
//! of an object grant nothing.

// Called by the MetaServer's authentication layer; until it is wired, only tests use it.

use serde_json::{Value, json};

/// The authenticated user of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

/// What a request asks (kube-apiserver's authorizer attributes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    /// `""` for cluster-scoped requests.
    pub namespace: String,
    /// `""` for collections.
    pub name: String,
    /// The URL path (used for non-resource requests).
    pub path: String,
    pub resource_request: bool,
}

/// Ok(()) when allowed, Err(reason) in the words kube-apiserver uses for 403
pub fn authorize(
    accesses: &[serde_json::Value],
    user: &UserInfo,
    attrs: &Attributes,
) -> Result<(), String> {
    let allowed = accesses
        .iter()
        .any(|access| access_allows(access, user, attrs));
    if allowed {
        Ok(())
    } else {
        Err(forbidden_message(user, attrs))
    }
}

/// The `Status` kube-apiserver answers a refused request with (403, reason `Forbidden`),
/// `message` being what [`authorize`] returned.
pub fn forbidden_status(attrs: &Attributes, message: &str) -> Value {
    let mut details = serde_json::Map::new();
    if attrs.resource_request {
        if !attrs.name.is_empty() {
            details.insert("name".into(), attrs.name.clone().into());
        }
        if !attrs.api_group.is_empty() {
            details.insert("group".into(), attrs.api_group.clone().into());
        }
        details.insert("kind".into(), attrs.resource.clone().into());
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": details,
        "code": 403,
    })
}

/// kube-apiserver's `forbiddenMessage` wrapped as `NewForbidden` words it.
fn forbidden_message(user: &UserInfo, a: &Attributes) -> String {
    if !a.resource_request {
        return format!(
            "forbidden: User {:?} cannot {} path {:?}",
            user.name, a.verb, a.path
        );
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {:?}", a.namespace)
    };
    let why = format!(
        "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
        user.name, a.verb, resource, a.api_group
    );
    let qualified = if a.api_group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.api_group)
    };
    match (qualified.is_empty(), a.name.is_empty()) {
        (true, _) => format!("forbidden: {why}"),
        (false, true) => format!("{qualified} is forbidden: {why}"),
        (false, false) => format!("{qualified} {:?} is forbidden: {why}", a.name),
    }
}

fn access_allows(access: &Value, user: &UserInfo, attrs: &Attributes) -> bool {
    let spec = access.get("spec");
    let cluster = items(spec, "accessClusterRoleBinding");
    let cluster_allows = cluster.iter().any(|entry| {
        let binding = entry.get("clusterRoleBinding");
        applies_to(user, subjects(binding), "") && rules_allow(entry.get("rules"), attrs)
    });
    if cluster_allows {
        return true;
    }
    if attrs.namespace.is_empty() || !attrs.resource_request {
        return false;
    }
    items(spec, "accessRoleBinding").iter().any(|entry| {
        let binding = entry.get("roleBinding");
        let ns = binding
            .and_then(|b| b.pointer("/metadata/namespace"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        ns == attrs.namespace
            && applies_to(user, subjects(binding), ns)
            && rules_allow(entry.get("rules"), attrs)
    })
}

fn items<'a>(spec: Option<&'a Value>, field: &str) -> &'a [Value] {
    spec.and_then(|s| s.get(field))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn subjects(binding: Option<&Value>) -> &[Value] {
    binding
        .and_then(|b| b.get("subjects"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get(field).and_then(Value::as_str).unwrap_or_default()
}

/// Kubernetes' `appliesTo`: does one of the subjects name this user?
fn applies_to(user: &UserInfo, subjects: &[Value], binding_ns: &str) -> bool {
    subjects.iter().any(|s| {
        let name = str_of(s, "name");
        match str_of(s, "kind") {
            "User" => !name.is_empty() && user.name == name,
            "Group" => !name.is_empty() && user.groups.iter().any(|g| g == name),
            "ServiceAccount" => {
                let ns = match str_of(s, "namespace") {
                    "" => binding_ns,
                    ns => ns,
                };
                !ns.is_empty()
                    && !name.is_empty()
                    && user.name == format!("system:serviceaccount:{ns}:{name}")
            }
            _ => false,
        }
    })
}

fn rules_allow(rules: Option<&Value>, attrs: &Attributes) -> bool {
    rules
        .and_then(Value::as_array)
        .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, attrs)))
}

fn strings<'a>(rule: &'a Value, field: &str) -> impl Iterator<Item = &'a str> {
    rule.get(field)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(Value::as_str)
}

/// Kubernetes' `RuleAllows`.
fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let verb_ok = strings(rule, "verbs").any(|v| v == "*" || v == a.verb);
    if !verb_ok {
        return false;
    }
    if !a.resource_request {
        return strings(rule, "nonResourceURLs").any(|u| {
            u == "*"
                || u == a.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| a.path.starts_with(prefix))
        });
    }
    let group_ok = strings(rule, "apiGroups").any(|g| g == "*" || g == a.api_group);
    let combined = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let resource_ok = strings(rule, "resources").any(|r| {
        r == "*"
            || r == combined
            || (!a.subresource.is_empty() && r.strip_prefix("*/") == Some(a.subresource.as_str()))
    });
    let mut names = strings(rule, "resourceNames").peekable();
    let name_ok = names.peek().is_none() || (!a.name.is_empty() && names.any(|n| n == a.name));
    group_ok && resource_ok && name_ok
}

#[cfg(test)]
#[path = "authz_tests.rs"]
mod tests;
