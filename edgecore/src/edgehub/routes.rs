//! Where edgehub hands what the cloud sends: by the message's group, to the module that owns
//! it (KubeEdge's edgehub dispatches the same way, to its modules' queues). Answers to the
//! edge's own requests go to their waiters before this (`parent_msg_id`).

use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message};
use tokio::sync::mpsc;

/// The modules' inputs. `None`: the module does not run, and its messages are dropped (and
/// logged at debug level; a node task is logged at info level, since someone asked for it).
#[derive(Debug, Clone)]
pub struct Routes {
    /// metamanager: groups `resource` and `func` (objects to store, the cloud's requests of
    /// the database).
    pub meta: mpsc::Sender<Message>,
    /// devicetwin: group `twin` (membership, answers to twin reports, desired values).
    pub twin: Option<mpsc::Sender<Message>>,
    /// eventbus: group `user` (the router's subscribe/publish operations).
    pub bus: Option<mpsc::Sender<Message>>,
    /// servicebus: group `user` from `router_servicebus` (calls, `start`/`stop`).
    pub servicebus: Option<mpsc::Sender<Message>>,
    /// taskmanager: group `taskmanager` (node tasks).
    pub tasks: Option<mpsc::Sender<Message>>,
}

/// Where one message goes.
pub(super) enum Route<'a> {
    /// To metamanager; it stopping means the edge stopped.
    Meta(&'a mpsc::Sender<Message>),
    /// To another module (name for the logs); it stopping drops the message.
    Module(&'static str, &'a mpsc::Sender<Message>),
    /// Nowhere: the module is off or unknown (why, for the log).
    Drop(&'static str, &'static str),
}

impl Routes {
    /// Everything metamanager does not own is dropped (programs and tests that run only it).
    pub fn meta_only(meta: mpsc::Sender<Message>) -> Routes {
        Routes {
            meta,
            twin: None,
            bus: None,
            servicebus: None,
            tasks: None,
        }
    }

    pub(super) fn of(&self, msg: &Message) -> Route<'_> {
        match msg.route.group {
            Group::Resource | Group::Func => Route::Meta(&self.meta),
            Group::Twin => module("devicetwin", &self.twin),
            Group::User if msg.route.source == source::ROUTER_SERVICEBUS => {
                module("servicebus", &self.servicebus)
            }
            Group::User => module("eventbus", &self.bus),
            Group::TaskManager => module("taskmanager", &self.tasks),
            _ => Route::Drop("none", "no module of this edgecore takes this group"),
        }
    }
}

fn module<'a>(name: &'static str, tx: &'a Option<mpsc::Sender<Message>>) -> Route<'a> {
    match tx {
        Some(tx) => Route::Module(name, tx),
        None => Route::Drop(name, "module is disabled"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::Operation;
    use serde_json::Value;

    fn msg(source: &str, group: Group) -> Message {
        Message::new(
            source,
            group,
            Operation::Update,
            "default/x/y".to_string(),
            Value::Null,
        )
    }

    fn name(r: Route<'_>) -> &'static str {
        match r {
            Route::Meta(_) => "metamanager",
            Route::Module(m, _) => m,
            Route::Drop(m, _) => m,
        }
    }

    #[test]
    fn messages_go_to_the_module_of_their_group() {
        let (tx, _rx) = mpsc::channel(1);
        let all = Routes {
            meta: tx.clone(),
            twin: Some(tx.clone()),
            bus: Some(tx.clone()),
            servicebus: Some(tx.clone()),
            tasks: Some(tx.clone()),
        };
        let cases = [
            (msg("edgecontroller", Group::Resource), "metamanager"),
            (msg("edgecontroller", Group::Func), "metamanager"),
            (msg("twin", Group::Twin), "devicetwin"),
            (msg(source::ROUTER_SERVICEBUS, Group::User), "servicebus"),
            (msg("router_eventbus", Group::User), "eventbus"),
            (msg("taskmanager", Group::TaskManager), "taskmanager"),
        ];
        for (m, want) in &cases {
            assert_eq!(name(all.of(m)), *want, "{:?}", m.route);
            assert!(!matches!(all.of(m), Route::Drop(..)));
        }
        let only = Routes::meta_only(tx);
        assert!(matches!(only.of(&cases[0].0), Route::Meta(_)));
        for (m, _) in &cases[2..] {
            assert!(matches!(only.of(m), Route::Drop(..)), "{:?}", m.route);
        }
        assert!(matches!(
            only.of(&msg("edged", Group::Meta)),
            Route::Drop("none", _)
        ));
    }
}
