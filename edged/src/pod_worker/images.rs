//! The image puller: images per their pull policy, one pull at a time, with the kubelet's
//! events and the image back-off.

use super::*;

impl PodWorker {
    pub(super) fn next_image_retry(&self) -> Option<Duration> {
        let now = SystemTime::now();
        self.image_failures
            .iter()
            .filter_map(|(image, at)| self.image_backoff.remaining(image, *at, now))
            .min()
            .map(|d| d + Duration::from_millis(50))
    }

    /// The image of `container`, pulled per its policy (with the kubelet's events).
    pub(super) async fn ensure_image(
        &mut self,
        container: &str,
        image: &str,
        policy: PullPolicy,
        namespace: &str,
        secrets: &[crate::spec::LocalObjectReference],
    ) -> Result<(String, Option<crate::cri::api::Image>), Waiting> {
        let runtime = &self.shared.runtime;
        let present = match runtime.image_status(image).await {
            Ok(p) => p,
            Err(e) => {
                let message = format!("Failed to inspect image \"{image}\": {e}");
                self.event(Some(container), EventType::Warning, "Failed", &message);
                return Err(Waiting::new(WaitingReason::ErrImagePull, message));
            }
        };
        match (policy, present) {
            (PullPolicy::Never, Some(i)) | (PullPolicy::IfNotPresent, Some(i)) => {
                let message = format!("Container image \"{image}\" already present on machine");
                self.event(Some(container), EventType::Normal, "Pulled", message);
                return Ok((i.id.clone(), Some(i)));
            }
            (PullPolicy::Never, None) => {
                let message =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                self.event(
                    Some(container),
                    EventType::Warning,
                    "ErrImageNeverPull",
                    &message,
                );
                return Err(Waiting::new(WaitingReason::ErrImageNeverPull, message));
            }
            _ => {}
        }
        let now = SystemTime::now();
        if let Some(failed) = self.image_failures.get(image)
            && self.image_backoff.remaining(image, *failed, now).is_some()
        {
            let message = format!("Back-off pulling image \"{image}\"");
            self.event(Some(container), EventType::Normal, "BackOff", &message);
            return Err(Waiting::new(WaitingReason::ImagePullBackOff, message));
        }
        self.event(
            Some(container),
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{image}\""),
        );
        let started = Instant::now();
        // Each matching credential in turn; anonymously when none applies.
        let mut auths: Vec<Option<crate::cri::api::AuthConfig>> = Vec::new();
        for s in secrets {
            match self.shared.objects.secret(namespace, &s.name).await {
                Ok(Some(secret)) => auths.extend(
                    crate::pull_secrets::credentials_for(&secret, image)
                        .into_iter()
                        .map(Some),
                ),
                Ok(None) => tracing::warn!(image, secret = %s.name, "image pull secret not found"),
                Err(e) => {
                    tracing::warn!(image, secret = %s.name, error = %e, "cannot read an image pull secret")
                }
            }
        }
        if auths.is_empty() {
            auths.push(None);
        }
        let (pulling, pulled) = {
            let _one_at_a_time = self.shared.pull_lock.lock().await;
            let pulling = Instant::now();
            let mut result = Err(None);
            for auth in auths {
                match runtime
                    .pull_image(image, auth, self.shared.config.image_pull_timeout)
                    .await
                {
                    Ok(r) => {
                        result = Ok(r);
                        break;
                    }
                    Err(e) => result = Err(Some(e)),
                }
            }
            (pulling, result)
        };
        match pulled {
            Ok(image_ref) => {
                tracing::debug!(
                    image,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "image pulled"
                );
                self.image_failures.remove(image);
                self.image_backoff.forget(image);
                let status = runtime.image_status(&image_ref).await.ok().flatten();
                let go = |d: Duration| kubeedge_shared::duration::format_go_duration(d);
                self.event(
                    Some(container),
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image \"{image}\" in {} ({} including waiting). Image size: {} bytes.",
                        go(pulling.elapsed()),
                        go(started.elapsed()),
                        status.as_ref().map_or(0, |i| i.size)
                    ),
                );
                Ok((image_ref, status))
            }
            Err(e) => {
                let now = SystemTime::now();
                self.image_backoff.next(image, now, now);
                self.image_failures.insert(image.to_string(), now);
                let why = e.map(|e| e.to_string()).unwrap_or_default();
                self.event(
                    Some(container),
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image \"{image}\": {why}"),
                );
                Err(Waiting::new(
                    WaitingReason::ErrImagePull,
                    format!("failed to pull image \"{image}\": {why}"),
                ))
            }
        }
    }
}
