//! Charts drawn on the server as inline SVG: no script, no library, readable without either.

use std::fmt::Write;

/// One series of a chart: a name for the legend and its CSS class (colour).
pub(crate) struct Series<'a> {
    pub name: &'a str,
    pub class: &'a str,
    pub values: &'a [f64],
}

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 120.0;

/// Grouped bars, one group per bucket, scaled to the largest value; `labels` name the first,
/// middle and last buckets under the axis (in HTML, so the stretched drawing does not stretch
/// them). Each bar has a `<title>` with its value, so a pointer or a screen reader can read it
/// exactly.
pub(crate) fn bars(title: &str, series: &[Series<'_>], labels: [&str; 3]) -> String {
    let buckets = series.iter().map(|s| s.values.len()).max().unwrap_or(0);
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .fold(0.0_f64, f64::max);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" viewBox="0 0 {WIDTH} {h}" preserveAspectRatio="none" role="img" aria-label="{t}">"#,
        h = HEIGHT,
        t = escape(title),
    );
    let _ = write!(
        svg,
        r#"<line class="axis" x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}"/>"#
    );
    if buckets > 0 && max > 0.0 {
        let slot = WIDTH / buckets as f64;
        let bar = (slot * 0.8 / series.len() as f64).max(0.5);
        for (i, s) in series.iter().enumerate() {
            for (b, v) in s.values.iter().enumerate() {
                if *v <= 0.0 {
                    continue;
                }
                let h = (v / max * (HEIGHT - 4.0)).max(1.0);
                let x = b as f64 * slot + slot * 0.1 + i as f64 * bar;
                let _ = write!(
                    svg,
                    r#"<rect class="{c}" x="{x:.2}" y="{y:.2}" width="{bar:.2}" height="{h:.2}"><title>{n}: {v}</title></rect>"#,
                    c = s.class,
                    y = HEIGHT - h,
                    n = escape(s.name),
                );
            }
        }
    }
    svg.push_str("</svg><div class=\"chart-axis\" aria-hidden=\"true\">");
    for label in labels {
        let _ = write!(svg, "<span>{}</span>", escape(label));
    }
    svg.push_str("</div>");
    svg
}

/// A small line without axes for a table cell: the shape of a series at a glance.
pub(crate) fn sparkline(values: &[f64]) -> String {
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    if values.len() < 2 || max <= 0.0 {
        return r#"<svg class="spark" viewBox="0 0 80 20" aria-hidden="true"><line class="flat" x1="0" y1="19" x2="80" y2="19"/></svg>"#.to_string();
    }
    let step = 80.0 / (values.len() - 1) as f64;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{:.1},{:.1}", i as f64 * step, 19.0 - v / max * 17.0))
        .collect();
    format!(
        r#"<svg class="spark" viewBox="0 0 80 20" aria-hidden="true"><polyline points="{}"/></svg>"#,
        points.join(" ")
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_skip_zeros() {
        let svg = bars(
            "t<",
            &[Series {
                name: "in",
                class: "a",
                values: &[0.0, 5.0, 10.0],
            }],
            ["a", "b", "c"],
        );
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("<title>in: 10</title>"));
        assert!(svg.contains(r#"height="116.00""#), "{svg}");
        assert!(svg.contains("<span>c</span>"));
        assert!(svg.contains("aria-label=\"t&lt;\""));
    }

    #[test]
    fn a_sparkline_of_nothing_is_flat() {
        assert!(sparkline(&[]).contains("flat"));
        assert!(sparkline(&[1.0, 2.0]).contains("polyline"));
    }
}
