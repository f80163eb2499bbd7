//! The configuration: YAML into typed, validated, resolved settings.
