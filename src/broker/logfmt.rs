//! Log lines in logfmt: `ts=… level=INFO msg="listening" listener=mqtt addr=127.0.0.1:1883`.
//! Every value that is not a plain word is quoted with `"` and `\` escaped.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// A `tracing_subscriber` event formatter writing logfmt.
#[derive(Debug, Default, Clone, Copy)]
pub struct Logfmt;

/// Append `value` to `out`, quoted when it holds anything but a plain word.
pub fn write_value(out: &mut String, value: &str) {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'=' && b != b'\\');
    if plain {
        out.push_str(value);
        return;
    }
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

struct Fields {
    message: Option<String>,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.rest.push(' ');
            self.rest.push_str(field.name());
            self.rest.push('=');
            write_value(&mut self.rest, value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl<S, N> FormatEvent<S, N> for Logfmt
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields {
            message: None,
            rest: String::new(),
        };
        event.record(&mut fields);
        let mut line = String::with_capacity(128);
        line.push_str("ts=");
        line.push_str(&humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string());
        line.push_str(" level=");
        line.push_str(event.metadata().level().as_str());
        line.push_str(" msg=");
        let message = fields.message.unwrap_or_default();
        // msg is always quoted, so `msg="listening"` reads the same every time.
        let mut quoted = String::new();
        write_value(&mut quoted, &message);
        if quoted.starts_with('"') {
            line.push_str(&quoted);
        } else {
            line.push('"');
            line.push_str(&quoted);
            line.push('"');
        }
        line.push_str(&fields.rest);
        writeln!(writer, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use super::write_value;

    #[test]
    fn quoting() {
        let mut s = String::new();
        write_value(&mut s, "127.0.0.1:1883");
        s.push(' ');
        write_value(&mut s, "two words \"q\"");
        s.push(' ');
        write_value(&mut s, "");
        assert_eq!(s, r#"127.0.0.1:1883 "two words \"q\"" """#);
    }
}
