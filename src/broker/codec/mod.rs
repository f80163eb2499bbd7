//! The MQTT 3.1.1 and 5.0 codec: bounded frame decoder, packet model, encoder.
