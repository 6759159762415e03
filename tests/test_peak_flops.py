"""MFU's datasheet peak: every card in the table by the full name torch reports, its neighbours (one name is a part
of another: "H200" of "H200 NVL", "L4" of "L40S") not mistaken for it, unknown cards and fp32 give None."""

import pytest
import torch

from cramming.impl import PEAK_TFLOPS, Runtime

# torch.cuda.get_device_name() as these cards report it, and their dense bf16 datasheet peak (TFLOP/s)
CARDS = {"NVIDIA H100 PCIe": 756.0, "NVIDIA H100 NVL": 835.0, "NVIDIA H100 80GB HBM3": 989.4,
         "NVIDIA H200": 989.4, "NVIDIA H200 NVL": 835.0, "NVIDIA GH200 480GB": 989.4,
         "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA A100 80GB PCIe": 312.0, "NVIDIA A100-PCIE-40GB": 312.0,
         "NVIDIA RTX A6000": 154.8, "NVIDIA L40S": 362.0, "NVIDIA L40": 181.0, "NVIDIA L4": 121.0}
UNKNOWN = ["NVIDIA GeForce RTX 4090", "NVIDIA A10", "Tesla V100-SXM2-16GB", "NVIDIA RTX 6000 Ada Generation"]


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
