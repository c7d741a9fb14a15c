//! `state.json`: a [`TrainState`] as JSON that reads back to the same
//! bits. Numbers are written shortest-round-trip; a loss that is NaN or
//! infinite (JSON has no such number) is the string `"NaN"`, `"inf"` or
//! `"-inf"`; generator states are hex strings (a u64 is past JSON's exact
//! integers in most readers).

use super::TrainState;
use crate::nn::EvalPoint;
use serde_json::{json, Map, Value};

/// The format's name and version (field `format`).
const FORMAT: &str = "fusegrad-checkpoint 1";

fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else if x.is_nan() {
        json!("NaN")
    } else if x > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

fn to_f64(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a number")),
        Value::String(s) if s == "NaN" => Ok(f64::NAN),
        Value::String(s) if s == "inf" => Ok(f64::INFINITY),
        Value::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
        other => Err(format!("{other} is not a number")),
    }
}

/// `state` of a model of element type `dtype` as pretty JSON.
pub(super) fn encode(state: &TrainState, dtype: &str) -> String {
    let rngs: Map<String, Value> = state
        .rngs
        .iter()
        .map(|(k, v)| (k.clone(), json!(format!("{v:#018x}"))))
        .collect();
    let evals: Vec<Value> = state
        .evals
        .iter()
        .map(|e| json!({"step": e.step, "val_bits": num(e.val_bits), "seconds": num(e.seconds)}))
        .collect();
    let v = json!({
        "format": FORMAT,
        "fusegrad": env!("CARGO_PKG_VERSION"),
        "dtype": dtype,
        "step": state.step,
        "data_position": state.data_position,
        "rngs": rngs,
        "config": state.config,
        "losses": state.losses.iter().map(|&x| num(x)).collect::<Vec<_>>(),
        "evals": evals,
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

/// The state and element type in `text`; errors name the field.
pub(super) fn decode(text: &str) -> Result<(TrainState, String), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let field = |k: &str| v.get(k).ok_or_else(|| format!("no field {k:?}"));
    let format = field("format")?.as_str().unwrap_or("");
    if format != FORMAT {
        return Err(format!("format {format:?}, this fusegrad reads {FORMAT:?}"));
    }
    let uint = |k: &str| {
        field(k)?
            .as_u64()
            .ok_or_else(|| format!("{k} is not a count"))
    };
    let dtype = field("dtype")?
        .as_str()
        .ok_or("dtype is not a string")?
        .to_string();
    let mut state = TrainState {
        step: uint("step")?,
        data_position: uint("data_position")?,
        ..TrainState::default()
    };
    for (k, s) in field("rngs")?.as_object().ok_or("rngs is not an object")? {
        let hex = s.as_str().and_then(|s| s.strip_prefix("0x"));
        let state_of = hex.and_then(|h| u64::from_str_radix(h, 16).ok());
        state.rngs.insert(
            k.clone(),
            state_of.ok_or(format!("rng {k} is not a hex state"))?,
        );
    }
    for (k, s) in field("config")?
        .as_object()
        .ok_or("config is not an object")?
    {
        let s = s.as_str().ok_or(format!("config {k} is not a string"))?;
        state.config.insert(k.clone(), s.to_string());
    }
    for x in field("losses")?.as_array().ok_or("losses is not a list")? {
        state.losses.push(to_f64(x)?);
    }
    for e in field("evals")?.as_array().ok_or("evals is not a list")? {
        let get = |k: &str| e.get(k).ok_or(format!("an eval has no {k}"));
        state.evals.push(EvalPoint {
            step: get("step")?
                .as_u64()
                .ok_or("an eval's step is not a count")? as usize,
            val_bits: to_f64(get("val_bits")?)?,
            seconds: to_f64(get("seconds")?)?,
        });
    }
    Ok((state, dtype))
}
