//! Codec tests: byte-exact examples, round trips, refusals, split points.
