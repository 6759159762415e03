"""MFU's datasheet peak: every card in the table by the full name torch reports, its neighbours (one name is a part
of another: "H200" of "H200 NVL", "L4" of "L40S") not mistaken for it, unknown cards and fp32 give None."""

import pytest
import torch

from cramming.impl import PEAK_TFLOPS, Runtime

# torch.cuda.get_device_name() as these cards report it, and their dense bf16 datasheet peak (TFLOP/s)
# (the cards the Cramming paper and its users ran, and the datacentre parts), with fp32 accumulation
CARDS = {"NVIDIA H100 PCIe": 756.0, "NVIDIA H100 NVL": 835.0, "NVIDIA H100 80GB HBM3": 989.4,
         "NVIDIA H200": 989.4, "NVIDIA H200 NVL": 835.0, "NVIDIA GH200 480GB": 989.4,
         "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA A100 80GB PCIe": 312.0, "NVIDIA A100-PCIE-40GB": 312.0,
         "NVIDIA RTX A6000": 154.8, "NVIDIA RTX A4000": 76.7, "NVIDIA L40S": 362.0, "NVIDIA L40": 181.0,
         "NVIDIA L4": 121.0, "NVIDIA GeForce RTX 4090": 165.2, "NVIDIA GeForce RTX 3090": 71.0,
         "NVIDIA GeForce RTX 2080 Ti": 53.8, "Tesla V100-SXM2-16GB": 125.0, "Tesla V100-SXM2-32GB": 125.0,
         "Tesla V100-PCIE-32GB": 112.0, "Tesla V100S-PCIE-32GB": 130.0, "Tesla T4": 65.0}
UNKNOWN = ["NVIDIA A10", "NVIDIA RTX 6000 Ada Generation", "NVIDIA GeForce RTX 3060"]


def peak(name: str, monkeypatch, precision: str = "bf16") -> float | None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    return Runtime(torch.device("cuda", 0), precision, compile=False).peak_flops()


@pytest.mark.parametrize("name", CARDS)
def test_each_card_gets_its_own_row(name, monkeypatch):
    assert peak(name, monkeypatch) == CARDS[name] * 1e12


def test_every_row_of_the_table_has_a_card_above():
    assert [key for key in PEAK_TFLOPS if not any(key in name for name in CARDS)] == []


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_cards_have_no_peak(name, monkeypatch):
    assert peak(name, monkeypatch) is None


def test_no_peak_in_fp32_or_on_cpu(monkeypatch):
    assert peak("NVIDIA H200", monkeypatch, precision="fp32") is None
    assert Runtime(torch.device("cpu"), "bf16", compile=False).peak_flops() is None


def test_the_users_peak_overrides_the_table(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 3060")
    assert Runtime(torch.device("cuda", 0), "bf16", False, peak_tflops=51.2).peak_flops() == 51.2e12
    assert Runtime(torch.device("cpu"), "fp32", False, peak_tflops=2.0).peak_flops() == 2.0e12


@pytest.mark.parametrize("capability,expected", [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"),
                                                 ((8, 6), "bf16"), ((9, 0), "bf16")])
def test_auto_precision_is_fp16_with_a_scaler_before_bf16_gpus(capability, expected, monkeypatch):
    """V100 (7.0), T4 and RTX 20xx (7.5) have fp16 tensor cores but no bf16: auto trains them in fp16 with the grad
    scaler rather than in fp32; Ampere and later (8.x, 9.0) in bf16."""
    from types import SimpleNamespace

    from cramming.impl import auto_precision, resolve

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert auto_precision(torch.device("cuda", 0)) == expected
    impl = SimpleNamespace(device="cuda", precision="auto", compile=False, attention="sdpa", rotary="torch",
                           loss="plain", compile_mode="default", peak_tflops=None)
    runtime = resolve(impl)
    assert runtime.precision == expected and runtime.grad_scaler().is_enabled() == (expected == "fp16")
    impl.peak_tflops = 51.2  # impl.peak_tflops travels to the runtime MFU is computed from
    assert resolve(impl).peak_flops() == 51.2e12
