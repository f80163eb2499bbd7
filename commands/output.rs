//! Output pieces every command shares, so tables and times read the same
//! in each command's human and JSON output.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use saguin_format::f21::time::format_unix_nanos;
use serde_json::{json, Value};

/// An empty table in the style every human summary uses.
pub fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    t
}

/// A Unix-nanosecond time as RFC 3339, `-` when unset (0).
pub fn time_text(nanos: i64) -> String {
    if nanos == 0 {
        "-".into()
    } else {
        format_unix_nanos(nanos)
    }
}

/// A Unix-nanosecond time as an RFC 3339 string, `null` when unset (0).
pub fn time_json(nanos: i64) -> Value {
    if nanos == 0 {
        Value::Null
    } else {
        json!(format_unix_nanos(nanos))
    }
}
