//! Internal-broker tests (the external-broker ones, against mosquitto, are in e2e).
