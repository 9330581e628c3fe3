//! What the cloud asks of the eventbus (devices reference §4.6): messages of group `user` from
//! the router (`source: router_eventbus`) — subscribe to or unsubscribe from a topic on the
//! node's behalf, publish a payload, or publish a rule message or an auth-info result.

use bytes::Bytes;
use kubeedge_shared::content::content_bytes;
use kubeedge_shared::{Message, Operation};
use serde_json::Value;

/// One action on the bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusOp {
    Subscribe(String),
    Unsubscribe(String),
    Publish { topic: String, payload: Bytes },
}

/// The action a cloud message asks for, or why there is none.
pub fn plan(node: &str, msg: &Message) -> Result<BusOp, String> {
    let resource = msg.route.resource.clone();
    let need_topic = || {
        if resource.is_empty() {
            Err(format!("{} without a topic", msg.route.operation))
        } else {
            Ok(resource.clone())
        }
    };
    match &msg.route.operation {
        Operation::Subscribe => Ok(BusOp::Subscribe(need_topic()?)),
        Operation::Unsubscribe => Ok(BusOp::Unsubscribe(need_topic()?)),
        Operation::Publish => Ok(BusOp::Publish {
            topic: need_topic()?,
            payload: content_bytes(&msg.content).into(),
        }),
        op if op.as_str() == "message" => {
            let message = match &msg.content {
                Value::String(s) => serde_json::from_str::<Value>(s).ok(),
                v => Some(v.clone()),
            }
            .and_then(|c| c.get("message").cloned())
            .ok_or("content has no \"message\" object")?;
            let topic = message
                .get("topic")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .ok_or("message.topic is missing")?
                .to_string();
            Ok(BusOp::Publish {
                topic,
                payload: message.to_string().into(),
            })
        }
        op if op.as_str() == "get_result" && resource == "auth_info" => Ok(BusOp::Publish {
            topic: format!("$hw/events/node/{node}/authInfo/get/result"),
            payload: content_bytes(&msg.content).into(),
        }),
        other => Err(format!("operation {other} is not an eventbus operation")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::Group;
    use kubeedge_shared::operation::source;
    use serde_json::json;

    fn msg(op: &str, resource: &str, content: Value) -> Message {
        Message::new(
            source::ROUTER_EVENTBUS,
            Group::User,
            Operation::from(op),
            resource,
            content,
        )
    }

    #[test]
    fn router_operations_become_bus_actions() {
        assert_eq!(
            plan("n", &msg("subscribe", "default/rule-topic", Value::Null)),
            Ok(BusOp::Subscribe("default/rule-topic".into()))
        );
        assert_eq!(
            plan("n", &msg("unsubscribe", "default/rule-topic", Value::Null)),
            Ok(BusOp::Unsubscribe("default/rule-topic".into()))
        );
        assert_eq!(
            plan("n", &msg("publish", "test", json!("hello"))),
            Ok(BusOp::Publish {
                topic: "test".into(),
                payload: Bytes::from_static(b"hello")
            })
        );
        let m = plan(
            "n",
            &msg("message", "x", json!({"message": {"topic": "t/1", "v": 1}})),
        )
        .unwrap();
        assert_eq!(
            m,
            BusOp::Publish {
                topic: "t/1".into(),
                payload: Bytes::from(r#"{"topic":"t/1","v":1}"#)
            }
        );
        assert_eq!(
            plan("edge-1", &msg("get_result", "auth_info", json!({"a": 1}))),
            Ok(BusOp::Publish {
                topic: "$hw/events/node/edge-1/authInfo/get/result".into(),
                payload: Bytes::from(r#"{"a":1}"#)
            })
        );
        assert!(plan("n", &msg("publish", "", json!("x"))).is_err());
        assert!(plan("n", &msg("message", "x", json!({"nope": 1}))).is_err());
        assert!(plan("n", &msg("frobnicate", "x", Value::Null)).is_err());
    }
}
