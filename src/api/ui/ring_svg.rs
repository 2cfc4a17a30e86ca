//! The ring drawn as an SVG circle: each live node's arcs of the hash space in its colour, the
//! ring version and live count in the middle. Pure text; names are escaped although the
//! configuration already limits them to `[A-Za-z0-9._-]`.

use std::f64::consts::PI;
use std::fmt::Write;

use super::page::esc;

/// Distinct colours, by a member's position among all members sorted by name (so a node keeps
/// its colour while others come and go).
pub const PALETTE: [&str; 8] = ["#2b7bb9", "#e4572e", "#29a36a", "#a05195", "#f0a202", "#17becf", "#8c564b", "#7f7f7f"];

const SIZE: f64 = 320.0;
const RADIUS: f64 = 120.0;
const WIDTH: f64 = 34.0;

/// An arc to draw: owner, start and end as fractions of the circle (`start == end`: all of it).
pub struct Segment<'a> {
    pub node: &'a str,
    pub colour: &'a str,
    pub start: f64,
    pub end: f64,
}

fn point(fraction: f64) -> (f64, f64) {
    // Clockwise from twelve o'clock.
    let angle = fraction * 2.0 * PI - PI / 2.0;
    (SIZE / 2.0 + RADIUS * angle.cos(), SIZE / 2.0 + RADIUS * angle.sin())
}

/// The SVG element.
pub fn render(arcs: &[Segment<'_>], ring_version: u64, live: usize) -> String {
    let c = SIZE / 2.0;
    let mut s = format!(
        "<svg id=\"ring\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {SIZE} {SIZE}\" width=\"{SIZE}\" \
         height=\"{SIZE}\" role=\"img\" aria-label=\"hash ring\">\
         <circle cx=\"{c}\" cy=\"{c}\" r=\"{RADIUS}\" fill=\"none\" stroke=\"#ddd\" stroke-width=\"{WIDTH}\"/>"
    );
    for a in arcs {
        let (node, colour) = (esc(a.node), esc(a.colour));
        let span = (a.end - a.start).rem_euclid(1.0);
        if span == 0.0 {
            let _ = write!(
                s,
                "<circle class=\"arc\" data-node=\"{node}\" cx=\"{c}\" cy=\"{c}\" r=\"{RADIUS}\" fill=\"none\" \
                 stroke=\"{colour}\" stroke-width=\"{WIDTH}\"/>"
            );
            continue;
        }
        let ((x1, y1), (x2, y2)) = (point(a.start), point(a.end));
        let large = u8::from(span > 0.5);
        let _ = write!(
            s,
            "<path class=\"arc\" data-node=\"{node}\" d=\"M{x1:.2} {y1:.2} A{RADIUS} {RADIUS} 0 {large} 1 {x2:.2} {y2:.2}\" \
             fill=\"none\" stroke=\"{colour}\" stroke-width=\"{WIDTH}\"/>"
        );
    }
    let label = if live == 0 { "no live nodes".to_string() } else { format!("{live} live") };
    let _ = write!(
        s,
        "<text x=\"{c}\" y=\"{}\" text-anchor=\"middle\" font-size=\"22\" font-weight=\"600\">ring v{ring_version}</text>\
         <text x=\"{c}\" y=\"{}\" text-anchor=\"middle\" font-size=\"16\" fill=\"#555\">{label}</text></svg>",
        c - 2.0,
        c + 22.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arcs_become_paths_and_a_whole_circle_a_circle() {
        let arcs = [
            Segment { node: "n1", colour: "#111", start: 0.0, end: 0.25 },
            Segment { node: "n2", colour: "#222", start: 0.25, end: 0.9 },
            Segment { node: "n<3", colour: "#333", start: 0.9, end: 0.0 },
        ];
        let svg = render(&arcs, 7, 3);
        assert_eq!(svg.matches("class=\"arc\"").count(), 3);
        assert!(svg.contains("data-node=\"n&lt;3\""), "{svg}");
        assert!(svg.contains("M160.00 40.00 A120 120 0 0 1 280.00 160.00"), "a quarter from the top: {svg}");
        assert!(svg.contains("A120 120 0 1 1"), "n2's arc is the large one: {svg}");
        assert!(svg.contains("ring v7") && svg.contains("3 live"));
        let whole = render(&[Segment { node: "solo", colour: "#111", start: 0.5, end: 0.5 }], 1, 1);
        assert!(whole.contains("<circle class=\"arc\" data-node=\"solo\""), "{whole}");
        assert!(render(&[], 9, 0).contains("no live nodes"));
    }
}
