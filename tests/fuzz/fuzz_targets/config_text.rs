//! Fuzzes the configuration's reader: any text an operator may write. It
//! may refuse, never panic or hang; a refusal names at least one problem.
//! A configuration it accepts is stated without panicking, and its
//! resolved document (`check-config --output`) loads back into the same
//! configuration, as a diff of two deployments relies on.
//!
//! Relative paths resolve under a directory that does not exist, so the
//! files an input names are read only where it names them absolutely.
//! Seeds: `fixtures/config/good/`.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use saguin::config::{Config, ConfigError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let origin = Path::new("/nonexistent/saguin-fuzz/saguin.yaml");
    let config = match Config::from_yaml_str(text, origin) {
        Ok(config) => config,
        Err(ConfigError::Invalid { problems, .. }) => {
            assert!(!problems.is_empty());
            return;
        }
        Err(other) => {
            assert!(!other.to_string().is_empty());
            return;
        }
    };
    let _ = config.warnings(0);
    let _ = config.unkept_providers();
    let _ = config.unserved();
    let _ = config.durability_summary();
    let _ = config.durability_at_start();
    let resolved = config.resolved();
    let document = resolved.to_string();
    let again = match Config::from_yaml_str(&document, origin) {
        Ok(again) => again,
        Err(error) => panic!("the resolved document does not load back: {error}\n{document}"),
    };
    assert_eq!(again.resolved(), resolved, "{document}");
});
