//! The plots of `isoswitch bench --scenario paper`: per table one SVG with the
//! per-node share of requests (grouped bars) and the latency distribution
//! (latency by percentile, one line per setup).

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

/// One setup's numbers for a plot.
pub struct Series {
    pub name: String,
    pub per_node: Vec<u64>,
    pub latency_us: Histogram<u64>,
}

const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

pub fn draw(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 16))
        .map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(520);
    share_panel(&left, series)?;
    latency_panel(&right, series)?;
    root.present().map_err(|e| e.to_string())
}

fn share_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[Series],
) -> Result<(), String> {
    let nodes = series.iter().map(|s| s.per_node.len()).max().unwrap_or(0);
    let groups = series.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption("share of requests per node (%)", ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(0f64..nodes as f64, 0f64..100f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(nodes)
        .x_label_formatter(&|x| format!("node {:02}", x.floor() as usize + 1))
        .draw()
        .map_err(|e| e.to_string())?;
    let width = 0.8 / groups as f64;
    for (g, s) in series.iter().enumerate() {
        let total: u64 = s.per_node.iter().sum();
        let colour = COLOURS[g % COLOURS.len()];
        let bars = s.per_node.iter().enumerate().map(|(n, &count)| {
            let pct = count as f64 * 100.0 / total.max(1) as f64;
            let x0 = n as f64 + 0.1 + g as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.95, pct)], colour.filled())
        });
        chart
            .draw_series(bars)
            .map_err(|e| e.to_string())?
            .label(s.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())
}

/// Latency (ms) at each percentile from 0 to 100.
fn percentiles(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    (0..=100)
        .map(|p| {
            let q = f64::from(p) / 100.0;
            (f64::from(p), h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect()
}

fn latency_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[Series],
) -> Result<(), String> {
    let curves: Vec<Vec<(f64, f64)>> = series.iter().map(|s| percentiles(&s.latency_us)).collect();
    let top = curves
        .iter()
        .flatten()
        .map(|&(_, ms)| ms)
        .fold(1.0f64, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(area)
        .caption("latency by percentile (ms)", ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..100f64, 0f64..top)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .draw()
        .map_err(|e| e.to_string())?;
    for (g, (s, curve)) in series.iter().zip(curves).enumerate() {
        let colour = COLOURS[g % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(curve, colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg_with_both_panels() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in [1_000, 500_000, 1_900_000] {
            h.record(us).unwrap();
        }
        let series = vec![Series {
            name: "isoswitch".into(),
            per_node: vec![10, 11, 9],
            latency_us: h,
        }];
        let path = std::env::temp_dir().join(format!("paper-plot-{}.svg", std::process::id()));
        draw(&path, "test", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.contains("<svg"));
        assert!(svg.contains("share of requests per node"));
        assert!(svg.contains("latency by percentile"));
    }
}
