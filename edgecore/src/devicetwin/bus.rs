//! MQTT clients over EventBus: twin updates and gets, state updates, membership gets, with
//! KubeEdge's result and error topics.

use super::*;

impl<L: CloudLink> State<L> {
    pub(super) async fn bus(&mut self, b: BusMessage) {
        let Some(req) = topics::classify(&b.topic) else {
            tracing::debug!(topic = %b.topic, "topic not for devicetwin; dropped");
            return;
        };
        let payload: Result<Value, String> =
            serde_json::from_slice(&b.payload).map_err(|e| e.to_string());
        let event_id = payload
            .as_ref()
            .ok()
            .and_then(|v| v.get("event_id"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match req {
            Request::TwinUpdate(id) => {
                let result_topic = topics::device(&id, "twin/update/result");
                let update = payload.and_then(|v| decode_content::<DeviceTwinUpdate>(&v));
                match update {
                    Ok(u) => self.twin_update(&id, u).await,
                    Err(e) => {
                        self.metrics.refused(metrics::Refusal::Malformed);
                        self.publish_error(result_topic, &event_id, 400, &e)
                    }
                }
            }
            Request::TwinGet(id) => self.twin_get(&id, &event_id),
            Request::StateUpdate(id) => match payload {
                Ok(v) => self.state_update(&id, &v).await,
                Err(e) => {
                    tracing::info!(device = %id, error = %e, "malformed state update; dropped")
                }
            },
            Request::MembershipGet(_) => {
                let topic = topics::node(&self.config.node_name, "membership/get/result");
                if let Err(e) = payload {
                    self.publish_error(topic, &event_id, 400, &e);
                    return;
                }
                let devices: Vec<Value> = self
                    .devices
                    .values()
                    .map(|d| {
                        serde_json::to_value(MemberDevice {
                            id: d.id.clone(),
                            name: d.name.clone(),
                            description: d.description.clone(),
                            state: d.state.clone(),
                            last_online: d.last_online.clone(),
                            ..MemberDevice::default()
                        })
                        .unwrap_or_default()
                    })
                    .collect();
                self.publish(
                    topic,
                    &json!({"event_id": event_id, "timestamp": now_millis(), "devices": devices}),
                );
            }
            other => {
                tracing::debug!(request = ?other, "device request not handled (no v1beta1 flow uses it); dropped")
            }
        }
    }

    /// An edge-side twin update (MQTT or a mapper's report).
    pub(crate) async fn twin_update(&mut self, id: &str, update: DeviceTwinUpdate) {
        self.twin_updates(vec![(id.to_string(), update)]).await;
    }

    /// Edge-side twin updates, applied in order and stored in one transaction; then each is
    /// published and every changed device reported once.
    pub(crate) async fn twin_updates(&mut self, updates: Vec<(String, DeviceTwinUpdate)>) {
        let now = now_millis();
        let mut applied = Vec::new();
        let mut rows: Vec<(String, Vec<(String, store::TwinRow)>)> = Vec::new();
        for (id, update) in updates {
            let result_topic = topics::device(&id, "twin/update/result");
            let Some(device) = self.devices.get_mut(&id) else {
                self.publish_error(result_topic, &update.event_id, 404, "device not found");
                continue;
            };
            match twin::apply_rest(device, &update, now) {
                Ok(outcome) => {
                    // Applied in memory at once, so later updates of the batch build on it;
                    // a failed write reloads the devices from the database.
                    for (name, row) in &outcome.rows {
                        device.twins.insert(name.clone(), row.clone());
                    }
                    if !outcome.rows.is_empty() {
                        rows.push((id.clone(), outcome.rows.clone()));
                    }
                    applied.push((id, update.event_id, outcome));
                }
                Err(r) => self.publish_error(result_topic, &update.event_id, r.code, &r.reason),
            }
        }
        if !rows.is_empty()
            && let Err(e) = store::write_twin_batch(&self.store, rows).await
        {
            tracing::warn!(error = %e, updates = applied.len(), "twin updates not stored");
            for (id, event_id, _) in &applied {
                let topic = topics::device(id, "twin/update/result");
                self.publish_error(topic, event_id, 500, &e.to_string());
            }
            self.reload().await;
            return;
        }
        let mut changed: Vec<String> = Vec::new();
        for (id, event_id, outcome) in applied {
            if !outcome.rows.is_empty() {
                self.metrics.twin_updates.inc();
                *self.generation.entry(id.clone()).or_default() += 1;
                self.unreported.insert(id.clone());
                if !changed.contains(&id) {
                    changed.push(id.clone());
                }
            }
            self.publish(
                topics::device(&id, "twin/update/result"),
                &json!({"event_id": event_id, "timestamp": now_millis(), "twin": outcome.result}),
            );
            if !outcome.document.is_empty() {
                self.publish(
                    topics::device(&id, "twin/update/document"),
                    &json!({"event_id": event_id, "timestamp": now_millis(), "twin": outcome.document}),
                );
            }
            if let Some((twins, delta)) = self.devices.get(&id).and_then(twin::delta) {
                self.publish(
                    topics::device(&id, "twin/update/delta"),
                    &json!({"event_id": new_message_id(), "timestamp": now_millis(), "twin": twins, "delta": delta}),
                );
            }
        }
        if self.link.is_connected() {
            for id in changed {
                self.report(&id).await;
            }
        }
    }

    fn twin_get(&self, id: &str, event_id: &str) {
        let topic = topics::device(id, "twin/get/result");
        let Some(d) = self.devices.get(id) else {
            self.publish_error(topic, event_id, 404, "device not found");
            return;
        };
        let twins: BTreeMap<&String, MsgTwin> = d
            .twins
            .iter()
            .filter(|(_, r)| r.attr_type != "deleted")
            .map(|(n, r)| (n, twin::msg_twin(r, false)))
            .collect();
        self.publish(
            topic,
            &json!({"event_id": event_id, "timestamp": now_millis(), "twin": twins}),
        );
    }

    pub(crate) async fn state_update(&mut self, id: &str, payload: &Value) {
        let state = payload
            .as_object()
            .and_then(|o| o.iter().find(|(k, _)| k.eq_ignore_ascii_case("state")))
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_default()
            .to_string();
        let lower = state.to_ascii_lowercase();
        if !["online", "offline", "ok", "unknown", "unhealthy"].contains(&lower.as_str()) {
            tracing::info!(device = id, %state, "device state not one of online/offline/ok/unknown/unhealthy; ignored");
            return;
        }
        if !self.devices.contains_key(id) {
            tracing::info!(device = id, "state update for an unknown device; ignored");
            return;
        }
        let last_online = if lower == "online" || lower == "ok" {
            let now = time::OffsetDateTime::now_utc();
            now.replace_nanosecond(0)
                .unwrap_or(now)
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        } else {
            String::new()
        };
        if let Err(e) = store::update_state(
            &self.store,
            id.to_string(),
            state.clone(),
            last_online.clone(),
        )
        .await
        {
            tracing::warn!(device = id, error = %e, "device state not stored");
            return;
        }
        let name = match self.devices.get_mut(id) {
            Some(d) => {
                d.state = state.clone();
                d.last_online = last_online.clone();
                d.name.clone()
            }
            None => return,
        };
        let msg = DeviceStateMsg {
            event_id: new_message_id(),
            timestamp: now_millis(),
            device: DeviceState {
                name,
                state,
                last_online_time: last_online,
            },
        };
        self.publish(topics::device(id, "state/update/result"), &msg);
        if self.link.is_connected() {
            let up = DeviceReport::State(msg).to_message(id);
            if let Err(e) = self.link.send(up).await {
                tracing::debug!(device = id, error = %e, "state not sent to the cloud");
            }
        }
    }
}
