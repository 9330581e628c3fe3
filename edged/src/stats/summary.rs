//! The kubelet's Summary API (`k8s.io/kubelet/pkg/apis/stats/v1alpha1`) as it serves it on
//! `/stats/summary`: field names and omitted-when-unknown fields as Go's `encoding/json`
//! writes them.

use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: String,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_names_and_omitted_fields_match_the_kubelet() {
        let s = Summary {
            node: NodeStats {
                node_name: "edge-1".into(),
                start_time: "2026-01-01T00:00:00Z".into(),
                cpu: Some(CpuStats {
                    time: "2026-01-01T00:01:00Z".into(),
                    usage_nano_cores: Some(5),
                    usage_core_nano_seconds: Some(7),
                }),
                memory: None,
                fs: None,
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u1".into(),
                },
                start_time: "2026-01-01T00:00:30Z".into(),
                containers: vec![ContainerStats {
                    name: "main".into(),
                    start_time: "2026-01-01T00:00:31Z".into(),
                    cpu: None,
                    memory: Some(MemoryStats {
                        time: "t".into(),
                        working_set_bytes: Some(4096),
                        ..Default::default()
                    }),
                    rootfs: None,
                }],
                cpu: None,
                memory: None,
            }],
        };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({
                "node": {"nodeName": "edge-1", "startTime": "2026-01-01T00:00:00Z",
                    "cpu": {"time": "2026-01-01T00:01:00Z", "usageNanoCores": 5, "usageCoreNanoSeconds": 7}},
                "pods": [{
                    "podRef": {"name": "web", "namespace": "default", "uid": "u1"},
                    "startTime": "2026-01-01T00:00:30Z",
                    "containers": [{"name": "main", "startTime": "2026-01-01T00:00:31Z",
                        "memory": {"time": "t", "workingSetBytes": 4096}}],
                }],
            })
        );
    }
}
