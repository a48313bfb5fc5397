//! SVG line plots of experiment results, drawn with plotters' SVG backend (no system fonts:
//! text is emitted as SVG `<text>` elements that the viewer renders).
//!
//! Each [`Panel`] is one chart: x = the varied option, y = a metric, one line per
//! [`Series`]. The x scale is chosen from the data: numbers spanning 16x or more (threads
//! 1..256) are drawn on a log-2 scale, numbers with a 0 spanning 100x or more and text values
//! (key distributions) are drawn as evenly spaced categories, other numbers linearly. Points
//! with the same x in one series (several seeds) are reduced to their median.

use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// An x value: a number or a category name.
#[derive(Clone, Debug, PartialEq)]
pub enum XValue {
    /// A number.
    Num(f64),
    /// A category, e.g. `zipf:1`.
    Text(String),
}

/// One line of a panel.
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// Its points, in any order.
    pub points: Vec<(XValue, f64)>,
}

/// One chart.
#[derive(Clone, Debug)]
pub struct Panel {
    /// The caption.
    pub title: String,
    /// The x axis label.
    pub x_label: String,
    /// The y axis label.
    pub y_label: String,
    /// Logarithmic y axis (points with y <= 0 are left out).
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
    /// x values (linear x scale) marked by a dashed grey vertical line, e.g. the instants the
    /// workload changed.
    pub x_marks: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum XScale {
    Linear,
    Log2,
    Categories,
}

/// How a panel maps x values to plot coordinates.
struct XMap {
    scale: XScale,
    /// Category names (or the numbers' text) in plot order, for custom ticks.
    ticks: Vec<(f64, String)>,
}

impl XMap {
    fn of(panel: &Panel) -> XMap {
        let xs: Vec<&XValue> = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|(x, _)| x))
            .collect();
        let mut nums: Vec<f64> = Vec::new();
        let mut cats: Vec<String> = Vec::new();
        for x in &xs {
            match x {
                XValue::Num(v) => {
                    if !nums.contains(v) {
                        nums.push(*v);
                    }
                }
                XValue::Text(t) => {
                    if !cats.contains(t) {
                        cats.push(t.clone());
                    }
                }
            }
        }
        nums.sort_by(f64::total_cmp);
        if !cats.is_empty() {
            // Numbers among text (unusual): categories too, after the names.
            cats.extend(nums.iter().map(|v| fmt_num(*v)));
            let ticks = cats
                .into_iter()
                .enumerate()
                .map(|(i, c)| (i as f64, c))
                .collect();
            return XMap {
                scale: XScale::Categories,
                ticks,
            };
        }
        let (lo, hi) = (
            nums.first().copied().unwrap_or(0.0),
            nums.last().copied().unwrap_or(1.0),
        );
        let few = nums.len() <= 16;
        let smallest_pos = nums.iter().copied().find(|v| *v > 0.0);
        if few && lo > 0.0 && hi / lo >= 16.0 {
            XMap {
                scale: XScale::Log2,
                ticks: nums.iter().map(|v| (v.log2(), fmt_num(*v))).collect(),
            }
        } else if nums.len() == 1
            || (few && lo == 0.0 && smallest_pos.is_some_and(|p| hi / p >= 100.0))
        {
            XMap {
                scale: XScale::Categories,
                ticks: nums
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (i as f64, fmt_num(*v)))
                    .collect(),
            }
        } else {
            XMap {
                scale: XScale::Linear,
                ticks: Vec::new(),
            }
        }
    }

    fn map(&self, x: &XValue) -> Option<f64> {
        match (self.scale, x) {
            (XScale::Linear, XValue::Num(v)) => Some(*v),
            (XScale::Log2, XValue::Num(v)) if *v > 0.0 => Some(v.log2()),
            (XScale::Categories, XValue::Num(v)) => self.index(&fmt_num(*v)),
            (XScale::Categories, XValue::Text(t)) => self.index(t),
            _ => None,
        }
    }

    fn index(&self, name: &str) -> Option<f64> {
        self.ticks.iter().find(|(_, n)| n == name).map(|(i, _)| *i)
    }
}

/// A number for a label: at most 3 significant digits, with k/M suffixes.
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    let (v, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if (v == v.trunc() && v.abs() < 1e4) || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}{suffix}")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A series' points in plot coordinates, sorted by x, one per x (the median y). On a log
/// axis an x whose median is not positive is left out; a zero among repeated passes still
/// counts in their median (a pass that collapsed to nothing is what a panel must show).
fn prepared(s: &Series, xm: &XMap, log_y: bool) -> Vec<(f64, f64)> {
    let mut by_x: Vec<(f64, Vec<f64>)> = Vec::new();
    for (x, y) in &s.points {
        let Some(px) = xm.map(x) else { continue };
        if !y.is_finite() {
            continue;
        }
        match by_x.iter_mut().find(|(bx, _)| *bx == px) {
            Some((_, ys)) => ys.push(*y),
            None => by_x.push((px, vec![*y])),
        }
    }
    let mut out: Vec<(f64, f64)> = by_x
        .into_iter()
        .map(|(x, ys)| (x, median(ys)))
        .filter(|(_, y)| !log_y || *y > 0.0)
        .map(|(x, y)| (x, if log_y { y.log10() } else { y }))
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

const WIDTH: u32 = 1150;
const LEGEND: u32 = 430;
const ROW: u32 = 17;

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e:?}")
}

/// Renders the panels, stacked vertically, as one SVG document.
pub fn render(panels: &[Panel]) -> anyhow::Result<String> {
    let most = panels.iter().map(|p| p.series.len()).max().unwrap_or(0) as u32;
    let panel_h = (90 + ROW * most).max(400);
    let height = panel_h * (panels.len().max(1) as u32);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let areas = root.split_evenly((panels.len().max(1), 1));
        for (panel, area) in panels.iter().zip(&areas) {
            draw_panel(&root, area, panel)?;
        }
        root.present().map_err(err)?;
    }
    Ok(buf)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_panel(root: &Area<'_>, area: &Area<'_>, panel: &Panel) -> anyhow::Result<()> {
    let (chart_area, legend_area) = area.split_horizontally(WIDTH - LEGEND);
    let xm = XMap::of(panel);
    let lines: Vec<Vec<(f64, f64)>> = panel
        .series
        .iter()
        .map(|s| prepared(s, &xm, panel.log_y))
        .collect();
    let all: Vec<(f64, f64)> = lines.iter().flatten().copied().collect();
    let (mut x0, mut x1) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let pad = if x1 > x0 { (x1 - x0) * 0.05 } else { 0.5 };
    let (x0, x1) = (x0 - pad, x1 + pad);
    let (ylo, yhi) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
    let (y0, y1) = if !ylo.is_finite() {
        (0.0, 1.0)
    } else if panel.log_y {
        let (a, b) = (ylo.floor(), yhi.ceil());
        (a, if b > a { b } else { a + 1.0 })
    } else {
        (0.0_f64.min(ylo), if yhi > 0.0 { yhi * 1.1 } else { 1.0 })
    };
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(&panel.title, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let log_y = panel.log_y;
    let y_fmt = move |v: &f64| {
        if log_y {
            fmt_num(10f64.powf(*v))
        } else {
            fmt_num(*v)
        }
    };
    let x_fmt = |v: &f64| fmt_num(*v);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(panel.x_label.as_str())
        .y_desc(panel.y_label.as_str())
        .y_label_formatter(&y_fmt)
        .x_label_formatter(&x_fmt)
        .label_style(("sans-serif", 11))
        .max_light_lines(2);
    if log_y {
        // One label per decade.
        mesh.y_labels((y1 - y0).round() as usize + 1);
    }
    if xm.scale != XScale::Linear {
        mesh.x_labels(0).disable_x_mesh();
    }
    mesh.draw().map_err(err)?;
    if xm.scale == XScale::Linear {
        let style = RGBColor(90, 90, 90).stroke_width(1);
        for &x in panel.x_marks.iter().filter(|x| (x0..=x1).contains(*x)) {
            chart
                .draw_series(DashedLineSeries::new([(x, y0), (x, y1)], 6, 4, style))
                .map_err(err)?;
        }
    }
    if xm.scale != XScale::Linear {
        // Ticks at the data's x values, labelled with them.
        let style =
            TextStyle::from(("sans-serif", 11).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        for (x, name) in &xm.ticks {
            let (px, py) = chart.backend_coord(&(*x, y0));
            root.draw(&Rectangle::new(
                [(px, py), (px + 1, py + 5)],
                BLACK.filled(),
            ))
            .map_err(err)?;
            root.draw(&Text::new(name.clone(), (px, py + 7), style.clone()))
                .map_err(err)?;
        }
    }
    for (i, pts) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?;
        if pts.len() <= 40 {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
    }
    // The legend, beside the chart.
    let font = ("sans-serif", 11).into_font();
    for (i, s) in panel.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let y = 40 + (i as i32) * ROW as i32;
        legend_area
            .draw(&Rectangle::new([(4, y - 4), (26, y - 1)], color.filled()))
            .map_err(err)?;
        let name = if s.name.chars().count() > 66 {
            let mut n: String = s.name.chars().take(65).collect();
            n.push('…');
            n
        } else {
            s.name.clone()
        };
        legend_area
            .draw(&Text::new(name, (32, y - 9), font.clone()))
            .map_err(err)?;
    }
    if all.is_empty() {
        chart_area
            .draw(&Text::new("no data", (100, 100), font))
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, pts: &[(f64, f64)]) -> Series {
        Series {
            name: name.into(),
            points: pts.iter().map(|&(x, y)| (XValue::Num(x), y)).collect(),
        }
    }

    #[test]
    fn svg_is_well_formed_with_one_line_per_series() {
        let p = Panel {
            title: "E3 <test> & co".into(),
            x_label: "threads".into(),
            y_label: "throughput".into(),
            log_y: true,
            series: vec![
                series("a", &[(1.0, 10.0), (4.0, 20.0), (64.0, 5.0)]),
                series("b", &[(1.0, 30.0), (4.0, 2.0), (64.0, 1.0), (64.0, 3.0)]),
            ],
            x_marks: Vec::new(),
        };
        let svg = render(&[p.clone(), p]).unwrap();
        assert!(
            svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        // Series lines are the 2-pixel polylines (axes and ticks are 1 pixel wide).
        let lines = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
            .count();
        assert_eq!(lines, 4, "{svg}");
        assert!(svg.contains("&lt;test&gt; &amp; co"), "{svg}");
        // Log-2 x ticks at the data values.
        assert!(svg.contains("\n64\n</text>"), "{svg}");
    }

    #[test]
    fn categories_and_medians() {
        let s = Series {
            name: "s".into(),
            points: vec![
                (XValue::Text("zipf:1".into()), 4.0),
                (XValue::Text("uniform".into()), 1.0),
                (XValue::Text("uniform".into()), 3.0),
                (XValue::Text("uniform".into()), 100.0),
            ],
        };
        let p = Panel {
            title: "t".into(),
            x_label: "dist".into(),
            y_label: "y".into(),
            log_y: false,
            series: vec![s],
            x_marks: Vec::new(),
        };
        let xm = XMap::of(&p);
        assert_eq!(xm.scale, XScale::Categories);
        assert_eq!(prepared(&p.series[0], &xm, false), [(0.0, 4.0), (1.0, 3.0)]);
        let svg = render(&[p]).unwrap();
        assert!(svg.contains("\nzipf:1\n</text>") && svg.contains("\nuniform\n</text>"));
    }

    #[test]
    fn empty_panels_still_render() {
        let p = Panel {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_y: true,
            series: vec![series("none", &[])],
            x_marks: vec![1.0],
        };
        assert!(render(std::slice::from_ref(&p))
            .unwrap()
            .contains("no data"));
        assert!(render(&[]).unwrap().contains("<svg"));
        // One x value: a category, labelled once.
        let one = Panel {
            series: vec![series("one", &[(128.0, 5.0)])],
            ..p
        };
        assert_eq!(XMap::of(&one).scale, XScale::Categories);
        assert_eq!(render(&[one]).unwrap().matches("\n128\n</text>").count(), 1);
    }

    #[test]
    fn x_marks_are_dashed_lines_on_linear_panels() {
        let p = Panel {
            title: "t".into(),
            x_label: "seconds".into(),
            y_label: "y".into(),
            log_y: false,
            series: vec![series("a", &[(0.1, 1.0), (0.2, 2.0), (0.3, 1.0)])],
            x_marks: vec![0.15, 0.25, 9.0],
        };
        let svg = render(&[p]).unwrap();
        // Two marks inside the x range, each drawn as dashes.
        let dashes = svg.matches("stroke=\"#5A5A5A\"").count();
        assert!(dashes >= 4, "{dashes} dashes: {svg}");
    }

    #[test]
    fn numbers_format_compactly() {
        assert_eq!(fmt_num(64.0), "64");
        assert_eq!(fmt_num(0.25), "0.25");
        assert_eq!(fmt_num(12345.0), "12.3k");
        assert_eq!(fmt_num(2_500_000.0), "2.5M");
        assert_eq!(fmt_num(316.2277), "316");
    }

    /// On a log-y panel a zero among repeated passes counts in their median (0, 100, 200
    /// plot as 100, not as the 150 of the two others); an x whose median is 0 is left out.
    #[test]
    fn a_zero_pass_counts_in_the_median_on_a_log_axis() {
        let p = Panel {
            title: "t".into(),
            x_label: "threads".into(),
            y_label: "y".into(),
            log_y: true,
            series: vec![series(
                "s",
                &[
                    (512.0, 0.0),
                    (512.0, 100.0),
                    (512.0, 200.0),
                    (2.0, 0.0),
                    (1.0, 5.0),
                ],
            )],
            x_marks: Vec::new(),
        };
        let xm = XMap::of(&p);
        let pts = prepared(&p.series[0], &xm, true);
        assert_eq!(pts.len(), 2, "{pts:?}");
        let at512 = pts
            .iter()
            .map(|(_, y)| 10f64.powf(*y).round())
            .fold(0.0, f64::max);
        assert_eq!(at512, 100.0, "{pts:?}");
    }
}
