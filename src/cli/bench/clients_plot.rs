//! The plot of `isoswitch bench --scenario clients`: CPU per message and
//! RSS against the number of client connections, one line per proxy, the
//! client count on a log scale (50 to 10,000).

use std::path::Path;

use plotters::prelude::*;

/// One proxy's curve: (clients, CPU µs per message, RSS MB) per count.
pub struct Curve {
    pub name: String,
    pub points: Vec<(f64, f64, f64)>,
}

const COLOURS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];

pub fn draw(path: &Path, curves: &[Curve]) -> Result<(), String> {
    let root = SVGBackend::new(path, (1100, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(
            "many terminals: the same 10k req/s from more client connections",
            ("sans-serif", 16),
        )
        .map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(550);
    panel(&left, curves, "CPU µs per message", |p| p.1)?;
    panel(&right, curves, "RSS (MB)", |p| p.2)?;
    root.present().map_err(|e| e.to_string())
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    curves: &[Curve],
    caption: &str,
    value: fn(&(f64, f64, f64)) -> f64,
) -> Result<(), String> {
    let all = curves.iter().flat_map(|c| c.points.iter());
    let (lo, hi) = all.fold((f64::MAX, 1.0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let lo = if lo == f64::MAX { 10.0 } else { lo * 0.8 };
    let top = curves
        .iter()
        .flat_map(|c| c.points.iter().map(value))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi * 1.25).log_scale(), 0f64..top)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("client connections (log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, c) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let line: Vec<(f64, f64)> = c.points.iter().map(|p| (p.0, value(p))).collect();
        chart
            .draw_series(LineSeries::new(line.clone(), colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(c.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], colour.stroke_width(2)));
        chart
            .draw_series(
                line.into_iter()
                    .map(|(x, y)| Circle::new((x, y), 4, colour.filled())),
            )
            .map_err(|e| e.to_string())?;
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
    fn draws_both_panels_with_a_line_per_proxy() {
        let curves = vec![
            Curve {
                name: "isoswitch".into(),
                points: vec![(50.0, 24.0, 60.0), (8000.0, 48.7, 677.0)],
            },
            Curve {
                name: "HAProxy (TCP mode)".into(),
                points: vec![(50.0, 21.0, 12.0), (8000.0, 32.8, 41.0)],
            },
        ];
        let path = std::env::temp_dir().join(format!("clients-plot-{}.svg", std::process::id()));
        draw(&path, &curves).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.contains("<svg"));
        assert!(svg.contains("CPU µs per message") && svg.contains("RSS (MB)"));
        assert!(svg.contains("HAProxy (TCP mode)"));
        // Nothing measured still makes a (blank) plot, not an error.
        let path = std::env::temp_dir().join(format!("clients-empty-{}.svg", std::process::id()));
        draw(&path, &[]).unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
