//! `isoswitch journal report --svg FILE`: the period's exchanges by outcome
//! and hour, one line per outcome, as an SVG a person can open in a
//! browser or attach to the day's reconciliation. Drawn from the report's
//! hourly counts ([`Report::by_hour`]): no row is read again.

use plotters::prelude::*;

use crate::store::journal_report::Report;

/// A chart plotters could not draw; `step` names the part being drawn.
#[derive(Debug, thiserror::Error)]
#[error("journal chart ({step}): {source}")]
pub struct ChartError {
    step: &'static str,
    #[source]
    source: DrawingAreaErrorKind<std::io::Error>,
}

impl ChartError {
    fn at(step: &'static str) -> impl FnOnce(DrawingAreaErrorKind<std::io::Error>) -> ChartError {
        move |source| ChartError { step, source }
    }
}

/// Colours by outcome, so a day's chart reads like the next day's: the
/// common outcome muted, the exceptions bright.
fn colour(outcome: &str) -> RGBColor {
    match outcome {
        "answered" => RGBColor(120, 120, 120),
        "switch-made" => RGBColor(214, 39, 40),
        "late" => RGBColor(255, 127, 14),
        "duplicate" => RGBColor(148, 103, 189),
        "unroutable" => RGBColor(140, 86, 75),
        "bad" => RGBColor(227, 119, 194),
        "unanswered" => RGBColor(31, 119, 180),
        "stored" => RGBColor(44, 160, 44),
        _ => RGBColor(23, 190, 207),
    }
}

/// The chart of `report` as SVG text; `title` heads it (the day).
pub fn outcomes_svg(report: &Report, title: &str) -> Result<String, ChartError> {
    let hours = report.by_hour.values().map(Vec::len).max().unwrap_or(24);
    let top = report
        .by_hour
        .values()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(ChartError::at("fill"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("exchanges by outcome and hour, {title}"),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(0u32..hours as u32, 0u64..top + top / 10 + 1)
            .map_err(ChartError::at("axes"))?;
        chart
            .configure_mesh()
            .x_desc("hour (UTC, from the period's start)")
            .y_desc("exchanges")
            .x_labels(hours.min(24))
            .draw()
            .map_err(ChartError::at("mesh"))?;
        for (outcome, counts) in &report.by_hour {
            let c = colour(outcome);
            let points = counts.iter().enumerate().map(|(h, &n)| (h as u32, n));
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))
                .map_err(ChartError::at("series"))?
                .label(outcome.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()
            .map_err(ChartError::at("legend"))?;
        root.present().map_err(ChartError::at("present"))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_a_named_series() {
        let mut report = Report::default();
        report.by_hour.insert("answered".into(), vec![5; 24]);
        report
            .by_hour
            .insert("switch-made".into(), [vec![0; 23], vec![3]].concat());
        let svg = outcomes_svg(&report, "2026-12-04").expect("drawn");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for name in ["answered", "switch-made", "2026-12-04"] {
            assert!(svg.contains(name), "{name} missing");
        }
        // An empty day draws an empty chart, not an error.
        assert!(outcomes_svg(&Report::default(), "-").is_ok());
    }
}
