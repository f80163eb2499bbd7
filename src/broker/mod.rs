//! The MQTT server.

pub mod codec;
