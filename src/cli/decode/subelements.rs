//! `decode`'s view of a field the spec gives a subelement layout
//! (`[field.subelements]`, Mastercard's DE 48): one line per part under the
//! field's own line. A content that does not follow the layout is still a
//! valid field: it is shown whole, with why it was not split.

use super::*;

/// Writes the parts of `field` if its definition has a layout. Each
/// subelement the spec flags is masked unless `reveal`; the others, and the
/// lead (a category code), are shown even when the field as a whole is
/// masked: a field is masked whole in logs because of some of its parts,
/// and the layout says which.
pub(super) fn text_subelements(
    out: &mut impl Write,
    field: &FieldRef<'_>,
    reveal: bool,
) -> io::Result<()> {
    let def = field.def();
    let Some(layout) = &def.subelements else {
        return Ok(());
    };
    let text: String = field.logical().map(char::from).collect();
    let parts = match layout.parse(def.id, &text) {
        Ok(parts) => parts,
        Err(e) => return writeln!(out, "          (not split into subelements: {e})"),
    };
    for part in parts {
        let (label, name, masked) = match part.tag {
            None => ("lead".to_string(), layout.lead_name.as_str(), false),
            Some(tag) => (
                format!("SE {tag}"),
                layout.name(tag).unwrap_or("(not named by the spec)"),
                layout.is_sensitive(tag) && !reveal,
            ),
        };
        let n = part.value.chars().count();
        if masked {
            writeln!(out, "          {label:<6} {name:<44} [masked {n} chars]")?;
        } else {
            let shown: String = part.value.chars().flat_map(char::escape_default).collect();
            writeln!(out, "          {label:<6} {name:<44} {shown}")?;
        }
    }
    Ok(())
}
