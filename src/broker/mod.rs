//! The MQTT server.
//!
//! ```text
//! TCP or TLS connection (transport)
//!   ├─ reader → codec FrameDecoder → adapter → broker event queue (bounded)
//!   └─ writer ← bounded outbound queue ← broker state actions
//!                                   │
//!                       BrokerState (single writer: sessions,
//!                       subscriptions, retained, auth decisions)
//! ```

pub mod codec;
pub mod connection;
pub mod logfmt;
pub mod message;
pub mod metrics;
pub mod retained;
pub mod server;
pub mod session;
pub mod state;
pub mod topic;
