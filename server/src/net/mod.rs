//! The trust boundary's edge: who may connect and call (listeners, TLS,
//! tokens, connection limits).

pub mod auth;
pub mod incoming;
pub mod listener;
pub mod local;
pub mod partial;
pub mod tls;
